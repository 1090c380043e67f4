# Shared preamble of the MPI checks in gtest/mpi/ (sourced, bash): mpi_setup LAUNCHER PACKAGE makes
# locked memory unlimited and fails (returns 1, after a FAIL line) unless an RDMA device is present
# and LAUNCHER (of Debian package PACKAGE) is installed.
mpi_setup() {
  ulimit -l unlimited 2>/dev/null
  [[ -n $(ls /sys/class/infiniband 2>/dev/null) ]] || { echo "FAIL: no RDMA devices"; return 1; }
  command -v "$1" >/dev/null || { echo "FAIL: no $1 (Debian package $2)"; return 1; }
}
