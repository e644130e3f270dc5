# Third-party dependencies, all from Debian's archive (scripts/deps installs them).
find_package(Threads REQUIRED)
find_package(msgpack REQUIRED)          # target msgpackc-cxx (header-only)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(ucx REQUIRED)             # ucx::ucp, ucx::uct, ucx::ucs
find_package(OpenSSL REQUIRED COMPONENTS Crypto)  # OpenSSL::Crypto: HMAC and nonces of peer authentication
if(FERRY_WITH_TESTS)
  find_package(GTest REQUIRED)
endif()
if(FERRY_WITH_BENCH)
  find_package(benchmark REQUIRED)
endif()

# CUDA is optional: built when nvcc is found. No target links libcuda directly; the driver API
# is reached through cudaGetDriverEntryPointByVersion so binaries start without a driver.
set(FERRY_HAVE_CUDA OFF)
if(FERRY_WITH_CUDA)
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The GPUs ferry's kernels run on. Machine code (-real) for Ampere (sm_80: A100, and by
    # binary compatibility sm_86/sm_89: A10, A40, L4, L40S, RTX 30xx/40xx), Hopper (sm_90),
    # Blackwell (sm_100: B200, GB200; sm_120: RTX 50xx, RTX PRO), and PTX of sm_120 that newer
    # devices compile when they load it. CUDA 13 has nothing older than sm_75. The kernels are
    # copies bound by memory, so sm_80 code loses nothing on sm_86/89. Each entry costs one
    # more device compile of the .cu files (README: CUDA architectures); a developer on one
    # GPU can pass -DFERRY_CUDA_ARCHS=native. ferry checks at run time that the kernels load
    # on each device (cuda::KernelsLoad) and says which architecture is missing.
    set(FERRY_CUDA_ARCHS "80-real;90-real;100-real;120" CACHE STRING
        "CUDA architectures of ferry's kernels (CMake's CUDA_ARCHITECTURES syntax)")
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "${FERRY_CUDA_ARCHS}")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(FERRY_HAVE_CUDA ON)
  endif()
endif()
message(STATUS "ferry: CUDA ${FERRY_HAVE_CUDA}")
