# Cross-building mha for aarch64 Linux on a Debian x86-64 host (scripts/test-aarch64.sh):
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Debian's cross compiler (g++-aarch64-linux-gnu) with the arm64 packages installed beside the
# host's (dpkg --add-architecture arm64: their libraries and CMake packages are under
# /usr/lib/aarch64-linux-gnu, their headers the same /usr/include files as the host's). Test
# programs run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR), which gtest_discover_tests and
# add_test use to start them.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# find_package and find_library search the multiarch folders of arm64 (lib/aarch64-linux-gnu),
# never the host's x86-64 ones.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
find_program(MHA_QEMU_AARCH64 qemu-aarch64)
if(MHA_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${MHA_QEMU_AARCH64})
endif()
