// Stands in for UCX's libucm_cuda in gmd's unit tests: only its name matters (md/ucm_events.cc
// stands down where a library of that name is loaded).
extern "C" int gmd_fake_ucm_cuda() { return 0; }
