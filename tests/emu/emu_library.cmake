# The CUDA backend on the emulation: a CPU-only libringattn (same SONAME, in emu/) whose cuda
# backend is kernels/cuda/*.cu compiled by g++ over the emulation and the fake runtime. Tests
# registered with CUDA run their executable against it (LD_LIBRARY_PATH before their RUNPATH)
# with RATEST_BACKEND=cuda: the real kernel and backend code in CI, without a GPU.
set(ra_emu_wrappers)
foreach(cu ${RINGATTN_CUDA_SOURCES})
  get_filename_component(stem ${cu} NAME_WE)
  set(wrapper ${CMAKE_CURRENT_BINARY_DIR}/emu_src/cuda_${stem}.cpp)
  file(WRITE ${wrapper}.in "// generated: ${cu} compiled as C++ over the SIMT emulation\n#include \"${cu}\"\n")
  configure_file(${wrapper}.in ${wrapper} COPYONLY)
  list(APPEND ra_emu_wrappers ${wrapper})
endforeach()
list(TRANSFORM RINGATTN_C_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/ OUTPUT_VARIABLE ra_emu_c_sources)
list(TRANSFORM RINGATTN_NCCL_SOURCES PREPEND ${PROJECT_SOURCE_DIR}/ OUTPUT_VARIABLE ra_emu_nccl_sources)
add_library(ringattn_emu SHARED ${ra_emu_c_sources} ${ra_emu_nccl_sources} ${ra_emu_wrappers}
                                ${RA_EMU_SOURCES})
# the fake NCCL's nccl.h (kernels/cuda/emu/nccl) before any real one
target_include_directories(ringattn_emu BEFORE PRIVATE ${PROJECT_SOURCE_DIR}/kernels/cuda/emu/nccl)
target_include_directories(ringattn_emu PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/include
                                                ${RINGATTN_CBLAS_INCLUDE})
target_compile_definitions(ringattn_emu PRIVATE RINGATTN_BUILDING RINGATTN_HAVE_CUDA RINGATTN_HAVE_NCCL
  _POSIX_C_SOURCE=200809L)
target_compile_options(ringattn_emu PRIVATE
  $<$<COMPILE_LANGUAGE:C>:${RINGATTN_WARNINGS} -ffp-contract=fast $<$<BOOL:${RINGATTN_NATIVE}>:-march=native>>
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
target_link_libraries(ringattn_emu PRIVATE ra_cpu_deps Threads::Threads m)
if(RINGATTN_ENABLE_MPI)
  target_link_libraries(ringattn_emu PRIVATE MPI::MPI_C)
  target_compile_definitions(ringattn_emu PRIVATE RINGATTN_HAVE_MPI)
endif()
set_target_properties(ringattn_emu PROPERTIES OUTPUT_NAME ringattn C_VISIBILITY_PRESET hidden
  SOVERSION ${PROJECT_VERSION_MAJOR} VERSION ${PROJECT_VERSION}
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/emu)
set(RINGATTN_EMU_TEST_ENV "RATEST_BACKEND=cuda;LD_LIBRARY_PATH=${CMAKE_CURRENT_BINARY_DIR}/emu")
