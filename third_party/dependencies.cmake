# External libraries, all from Debian's packages or the CUDA Toolkit. Nothing is vendored: each is
# found on the system, and when one is missing the configure step stops with the Debian package that
# provides it (scripts/setup.sh installs them all).

# duet_require(<what> <debian-package> <found-variable>): fail configure with an actionable message.
function(duet_require what package found)
  if(NOT ${found})
    message(FATAL_ERROR "duet needs ${what}, which was not found. On Debian or Ubuntu: "
                        "apt-get install ${package} (or run ./scripts/setup.sh, which installs every dependency)")
  endif()
endfunction()

find_package(fmt CONFIG QUIET)
duet_require("fmt" libfmt-dev fmt_FOUND)
find_package(nlohmann_json CONFIG QUIET)
duet_require("nlohmann-json" nlohmann-json3-dev nlohmann_json_FOUND)
find_package(OpenMP QUIET)
duet_require("OpenMP (libgomp, comes with GCC)" build-essential OpenMP_CXX_FOUND)
find_package(Threads REQUIRED)

find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp)
  duet_require("CLI11" libcli11-dev CLI11_INCLUDE_DIR)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  target_include_directories(CLI11::CLI11 INTERFACE ${CLI11_INCLUDE_DIR})
endif()

find_path(STB_INCLUDE_DIR stb_image.h PATHS /usr/include/stb)
duet_require("stb_image (header)" libstb-dev STB_INCLUDE_DIR)
# libstb-dev ships the implementations compiled (libstb.so/.a): link it, define no STB_*_IMPLEMENTATION.
find_library(STB_LIBRARY stb)
duet_require("stb (library)" libstb-dev STB_LIBRARY)

# Image decoding: libjpeg-turbo (Debian's libjpeg-dev) and libpng (libpng-dev), both fuzzed
# upstream by OSS-Fuzz. stb (above) is only the tests' image writer now.
find_package(JPEG QUIET)
duet_require("libjpeg (libjpeg-turbo)" libjpeg-dev JPEG_FOUND)
find_package(PNG QUIET)
duet_require("libpng" libpng-dev PNG_FOUND)

# Protocol buffers, for two formats: TensorBoard's event files (reports/tensorboard_event.proto,
# compiled by protoc from protobuf-compiler) and ONNX's messages. One full runtime (libprotobuf-dev;
# it holds the lite API the generated code uses) is shared by both parts of the process.
find_package(Protobuf QUIET)
if(NOT Protobuf_PROTOC_EXECUTABLE OR NOT TARGET protobuf::libprotobuf)
  set(DUET_PROTOBUF_OK OFF)
else()
  set(DUET_PROTOBUF_OK ON)
endif()
duet_require("Protocol Buffers (protoc and the C++ runtime)" "protobuf-compiler libprotobuf-dev" DUET_PROTOBUF_OK)

# ONNX export (`duet export --onnx`, export/): onnx's own protobuf classes (onnx::ModelProto), its
# checker and shape inference, from Debian's libonnx-dev (ONNX 1.12: opsets up to 17). ONNX's CMake
# config names protobuf::libprotobuf without looking for it, hence Protobuf above first.
find_package(ONNX CONFIG QUIET)
duet_require("ONNX (C++ headers and library, for ONNX export)" libonnx-dev ONNX_FOUND)

# oneDNN. duet uses its CPU engine only, so it links the library directly instead of going through
# dnnl-config.cmake: Debian builds oneDNN with the OpenCL GPU runtime, and that config calls
# find_package(OpenCL REQUIRED), which needs the OpenCL headers and development library
# (ocl-icd-opencl-dev, only recommended by libdnnl-dev). The runtime loader libOpenCL.so.1 that
# libdnnl.so itself needs is a hard dependency of libdnnl2 and comes with it.
set(DUET_HAVE_DNNL OFF)
if(DUET_ONEDNN)
  find_library(DNNL_LIBRARY dnnl)
  find_path(DNNL_INCLUDE_DIR dnnl.hpp PATH_SUFFIXES oneapi/dnnl)
  if(NOT DNNL_LIBRARY OR NOT DNNL_INCLUDE_DIR)
    message(FATAL_ERROR "duet's cpu backend needs oneDNN, which was not found. On Debian or Ubuntu: "
                        "apt-get install libdnnl-dev (or run ./scripts/setup.sh); "
                        "or configure with -DDUET_ONEDNN=OFF to compute on the reference loops only")
  endif()
  add_library(DNNL::dnnl UNKNOWN IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES IMPORTED_LOCATION ${DNNL_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${DNNL_INCLUDE_DIR})
  set(DUET_HAVE_DNNL ON)
endif()

# MPI (Open MPI from Debian: openmpi-bin, libopenmpi-dev) for data-parallel training across
# processes. Optional: without it duet runs as one process, exactly as before. Only MPI's C API is
# used (MPI_CXX_SKIP_MPICXX leaves out the deprecated C++ bindings).
set(DUET_HAVE_MPI OFF)
if(DUET_MPI)
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(DUET_HAVE_MPI ON)
  else()
    message(STATUS "duet: MPI not found: building without data-parallel training across processes "
                   "(apt-get install openmpi-bin libopenmpi-dev, or ./scripts/setup.sh, then reconfigure)")
  endif()
endif()
find_program(DUET_MPIEXEC NAMES mpirun mpiexec)  # for the tests; empty: they skip visibly

if(DUET_BUILD_TESTS)
  find_package(GTest QUIET)
  if(NOT TARGET GTest::gtest OR NOT TARGET GTest::gtest_main)
    message(FATAL_ERROR "duet's tests need GoogleTest, which was not found. On Debian or Ubuntu: "
                        "apt-get install libgtest-dev libgmock-dev (or run ./scripts/setup.sh); "
                        "or configure with -DDUET_BUILD_TESTS=OFF")
  endif()
endif()
get_filename_component(DUET_DEFAULT_DATA_DIR "${CMAKE_CURRENT_LIST_DIR}/../../shared/data" ABSOLUTE)
set(DUET_DATA_DIR "${DUET_DEFAULT_DATA_DIR}" CACHE PATH "Folder with cifar10/ and cats_dogs/ for tests and benchmarks")
if(DUET_BUILD_BENCH)
  find_package(benchmark QUIET)
  if(NOT benchmark_FOUND)
    message(FATAL_ERROR "duet's microbenchmarks need Google Benchmark, which was not found. On Debian or "
                        "Ubuntu: apt-get install libbenchmark-dev (or run ./scripts/setup.sh); "
                        "or configure with -DDUET_BUILD_BENCH=OFF")
  endif()
endif()

# CUDA: the backend is built when the toolkit and cuDNN are present (AUTO) or demanded (ON). The
# CUDA Toolkit is not a Debian package: it comes from NVIDIA's installer, in /usr/local/cuda.
set(DUET_ENABLE_CUDA OFF)
if(NOT DUET_CUDA STREQUAL "OFF")
  # NVIDIA's installer puts nvcc in /usr/local/cuda/bin, which is not on a fresh shell's PATH: look
  # there too, so that the README's commands build the backend wherever the toolkit is installed.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(DUET_NVCC nvcc PATHS /usr/local/cuda/bin)
    if(DUET_NVCC)
      get_filename_component(DUET_NVCC_REAL "${DUET_NVCC}" REALPATH)
      set(CMAKE_CUDA_COMPILER "${DUET_NVCC_REAL}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  # Debian 12's CMake 3.25 sets a property on CUDA::nvToolsExt whether or not the library was found,
  # and CUDA 12.9+ no longer ships it (nvtx3 is header-only), so find_package(CUDAToolkit) fails at
  # configure. An empty stand-in lets it finish; duet does not link nvToolsExt. Newer CMake checks
  # for the target first.
  if(CMAKE_VERSION VERSION_LESS 3.27 AND NOT TARGET CUDA::nvToolsExt)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  endif()
  find_package(CUDAToolkit QUIET)
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND AND CUDNN_LIBRARY AND CUDNN_INCLUDE_DIR)
    set(DUET_ENABLE_CUDA ON)
  elseif(DUET_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DUET_CUDA=ON, but the CUDA backend needs nvcc, the CUDA Toolkit (cuBLAS) and "
                        "cuDNN 9: found nvcc '${CMAKE_CUDA_COMPILER}', toolkit ${CUDAToolkit_FOUND}, "
                        "cudnn library '${CUDNN_LIBRARY}', cudnn.h '${CUDNN_INCLUDE_DIR}'. "
                        "Put nvcc on PATH (usually /usr/local/cuda/bin) or pass -DCMAKE_CUDA_COMPILER=")
  elseif(CMAKE_CUDA_COMPILER OR CUDAToolkit_FOUND)
    message(STATUS "duet: CUDA found but not complete (nvcc '${CMAKE_CUDA_COMPILER}', cuDNN "
                   "'${CUDNN_LIBRARY}'): building without the CUDA backend")
  endif()
endif()

# NCCL (shipped with the CUDA Toolkit) for GPU collectives in data-parallel runs: built when the
# CUDA backend and MPI are (MPI starts the ranks and hands out NCCL's unique id).
set(DUET_HAVE_NCCL OFF)
if(DUET_ENABLE_CUDA AND DUET_HAVE_MPI)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(NCCL_LIBRARY AND NCCL_INCLUDE_DIR)
    set(DUET_HAVE_NCCL ON)
  else()
    message(STATUS "duet: NCCL not found (nccl.h, libnccl): data-parallel runs on GPUs are refused with a message")
  endif()
endif()

# TensorBoard's CRC32C for its event records (reports/event_file.cpp): Intel ISA-L's (libisal-dev;
# Debian 12 has no package of Google's crc32c).
find_path(ISAL_INCLUDE_DIR isa-l/crc.h)
find_library(ISAL_LIBRARY isal)
if(ISAL_INCLUDE_DIR AND ISAL_LIBRARY)
  set(DUET_ISAL_OK ON)
else()
  set(DUET_ISAL_OK OFF)
endif()
duet_require("Intel ISA-L (its CRC32C)" libisal-dev DUET_ISAL_OK)
add_library(ISAL::isal UNKNOWN IMPORTED)
set_target_properties(ISAL::isal PROPERTIES IMPORTED_LOCATION ${ISAL_LIBRARY} INTERFACE_INCLUDE_DIRECTORIES ${ISAL_INCLUDE_DIR})
