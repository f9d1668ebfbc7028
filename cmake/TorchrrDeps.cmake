# Finds torchrr's dependencies. A missing one fails with how to fix it.
function(torchrr_require found what)
  if(NOT ${found})
    message(FATAL_ERROR "torchrr: ${what} not found: run `make setup` (or install the Debian "
                        "packages listed in tools/setup.sh)")
  endif()
endfunction()

find_package(Threads REQUIRED)
find_package(PkgConfig)

find_package(FlatBuffers CONFIG QUIET)
find_program(FLATC flatc)
torchrr_require(FlatBuffers_FOUND "FlatBuffers (libflatbuffers-dev)")
torchrr_require(FLATC "flatc (flatbuffers-compiler)")

find_path(ZSTD_INCLUDE_DIR zstd.h)
find_library(ZSTD_LIBRARY zstd)
torchrr_require(ZSTD_LIBRARY "zstd (libzstd-dev)")
add_library(torchrr_zstd INTERFACE)
target_include_directories(torchrr_zstd INTERFACE ${ZSTD_INCLUDE_DIR})
target_link_libraries(torchrr_zstd INTERFACE ${ZSTD_LIBRARY})

find_path(XXHASH_INCLUDE_DIR xxhash.h)
find_library(XXHASH_LIBRARY xxhash)
torchrr_require(XXHASH_LIBRARY "xxHash (libxxhash-dev)")
add_library(torchrr_xxhash INTERFACE)
target_include_directories(torchrr_xxhash INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(torchrr_xxhash INTERFACE ${XXHASH_LIBRARY})

find_package(fmt CONFIG QUIET)
torchrr_require(fmt_FOUND "fmt (libfmt-dev)")
find_package(nlohmann_json CONFIG QUIET)
torchrr_require(nlohmann_json_FOUND "nlohmann-json (nlohmann-json3-dev)")
find_package(CLI11 CONFIG QUIET)
torchrr_require(CLI11_FOUND "CLI11 (libcli11-dev)")
if(TORCHRR_BUILD_TESTS)
  find_package(GTest QUIET)
  torchrr_require(GTest_FOUND "GoogleTest (libgtest-dev)")
endif()

# Torch: the one in TORCHRR_PYTHON's environment (the project's .venv by default; under pip, the
# Python that runs pip), through its own CMake config, so the same recipe builds against a user's
# torch. The versions the recorder supports: each has its layout in recorder/src/internals/torch_compat.h,
# and tools/torch_matrix.sh tests them; the Python package refuses any other at run time.
set(TORCHRR_TORCH_MIN 2.9)
set(TORCHRR_TORCH_MAX 2.15)
if(NOT TORCHRR_PYTHON AND SKBUILD)
  set(TORCHRR_PYTHON ${Python_EXECUTABLE})
endif()
set(TORCHRR_TORCH_FOUND OFF)
if(TORCHRR_WITH_TORCH AND TORCHRR_PYTHON)
  execute_process(
    COMMAND ${TORCHRR_PYTHON} -c "import torch, sys; sys.stdout.write(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE TORCHRR_TORCH_PREFIX RESULT_VARIABLE torch_rc ERROR_VARIABLE torch_error)
  if(NOT torch_rc EQUAL 0)
    # Said, not swallowed: a torch that does not import is otherwise just "torch not found".
    # Its last line; a Python that cannot start at all may say nothing (the result says why).
    string(STRIP "${torch_error}" torch_error_text)
    string(REGEX REPLACE ".*\n" "" torch_error_line "${torch_error_text}")
    if(torch_error_line STREQUAL "")
      set(torch_error_line "no message")
    endif()
    message(STATUS "torchrr: `import torch` failed in ${TORCHRR_PYTHON} (${torch_rc}): "
                   "${torch_error_line}")
  endif()
  if(torch_rc EQUAL 0)
    list(APPEND CMAKE_PREFIX_PATH ${TORCHRR_TORCH_PREFIX})
    # Torch's config looks for CUDA when its libraries were built with it; the CPU build of
    # torchrr does not need that, and CUPTI is found separately.
    # A CUDA build of torch probes the installed GPUs with a test program unless told the
    # architectures; there is no GPU at build time here, and the recorder compiles no CUDA.
    if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
      set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
    endif()
    find_package(Torch CONFIG QUIET)
    if(Torch_FOUND)
      set(TORCHRR_TORCH_FOUND ON)
      # torch's CUDA libraries need the libraries of pip's NVIDIA wheels (NCCL, cuDNN, ...), which
      # they find at run time through their own RPATH. The linker looks for them first along the
      # -rpath list, where the CUDA toolkit's older copies (an older libnccl) would be found and
      # fail the link of every executable with undefined symbols: the wheels' come first.
      file(GLOB nvidia_lib_dirs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
      if(nvidia_lib_dirs)
        list(JOIN nvidia_lib_dirs ":" nvidia_lib_path)
        list(APPEND TORCH_LIBRARIES "-Wl,-rpath-link,${nvidia_lib_path}")
      endif()
      execute_process(
        COMMAND ${TORCHRR_PYTHON} -c "import torch, sys; sys.stdout.write(torch.__version__)"
        OUTPUT_VARIABLE TORCHRR_TORCH_VERSION)
      string(REGEX MATCH "^[0-9]+\\.[0-9]+" torch_minor "${TORCHRR_TORCH_VERSION}")
      if(torch_minor VERSION_LESS TORCHRR_TORCH_MIN OR torch_minor VERSION_GREATER TORCHRR_TORCH_MAX)
        message(FATAL_ERROR "torchrr: torch ${TORCHRR_TORCH_VERSION} (${TORCHRR_PYTHON}) is outside "
                            "the versions torchrr supports, ${TORCHRR_TORCH_MIN} to "
                            "${TORCHRR_TORCH_MAX}: install one of those into that environment, or "
                            "build without the recorder (-DTORCHRR_WITH_TORCH=OFF)")
      endif()
      message(STATUS "torchrr: building against torch ${TORCHRR_TORCH_VERSION} (${TORCHRR_TORCH_PREFIX})")
    endif()
  endif()
endif()
if(NOT TORCHRR_TORCH_FOUND)
  message(STATUS "torchrr: torch not found; building format/ and the replayer only")
endif()
