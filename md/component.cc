// Placeholder until the MD lands: the module builds and loads, registering nothing.
