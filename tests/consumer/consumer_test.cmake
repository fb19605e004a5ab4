# Run by ctest (see CMakeLists.txt) as: cmake -D... -P consumer_test.cmake
# Inputs: RINGATTN_BINARY_DIR PROJECT_DIR WORK_DIR GENERATOR C_COMPILER PKG_CONFIG LIBDIR SANITIZE
cmake_minimum_required(VERSION 3.18)

set(prefix "${RINGATTN_BINARY_DIR}/consumer-prefix")
set(build "${WORK_DIR}/consumer-build")
set(libdir "${prefix}/${LIBDIR}")
set(san_flags "")
if(SANITIZE)
  # The library is instrumented: a consumer must link the sanitizer runtimes too.
  set(san_flags "-fsanitize=address,undefined -fno-omit-frame-pointer")
endif()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer: ${what} failed (exit ${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE "${prefix}" "${build}")

# 1. install into the temporary prefix
run("install" "${CMAKE_COMMAND}" --install "${RINGATTN_BINARY_DIR}" --prefix "${prefix}")

# 2. find_package(ringattn) + ringattn::ringattn
run("configure consumer project" "${CMAKE_COMMAND}" -S "${PROJECT_DIR}" -B "${build}"
    -G "${GENERATOR}" "-DCMAKE_C_COMPILER=${C_COMPILER}" -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_C_FLAGS=${san_flags}"
    "-DRINGATTN_EXPECTED_PREFIX=${prefix}")
run("build consumer project" "${CMAKE_COMMAND}" --build "${build}")
run("run consumer (find_package)"
    "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${libdir}" "${build}/consumer")

# 3. pkg-config --cflags --libs ringattn
if(NOT PKG_CONFIG)
  message(FATAL_ERROR "consumer: pkg-config not found (Debian: apt-get install pkg-config)")
endif()
set(ENV{PKG_CONFIG_PATH} "${libdir}/pkgconfig")
execute_process(COMMAND "${PKG_CONFIG}" --cflags --libs ringattn
  RESULT_VARIABLE rc OUTPUT_VARIABLE pc_flags ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer: pkg-config --cflags --libs ringattn failed: ${err}")
endif()
message("pkg-config --cflags --libs ringattn: ${pc_flags}")
separate_arguments(pc_list UNIX_COMMAND "${pc_flags}")
# The installed .pc must point into the prefix it was installed to (relocatable install).
foreach(flag IN LISTS pc_list)
  if(flag MATCHES "^-[IL](.*)$")
    string(FIND "${CMAKE_MATCH_1}" "${prefix}/" pos)
    if(NOT pos EQUAL 0)
      message(FATAL_ERROR "consumer: ringattn.pc gives ${flag}, outside the prefix it was "
        "installed to (${prefix}): the .pc file is not relocatable")
    endif()
  endif()
endforeach()
separate_arguments(san_list UNIX_COMMAND "${san_flags}")
run("compile consumer with pkg-config flags" "${C_COMPILER}" -std=c11 -O2 ${san_list}
    "${PROJECT_DIR}/main.c" -o "${WORK_DIR}/consumer_pkgconfig" ${pc_list} -lm)
run("run consumer (pkg-config)"
    "${CMAKE_COMMAND}" -E env "LD_LIBRARY_PATH=${libdir}" "${WORK_DIR}/consumer_pkgconfig")
message("consumer: find_package and pkg-config builds both ok")
