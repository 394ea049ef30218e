# MOEBATCH_UNITY: unity builds (CMake's UNITY_BUILD, up to 8 sources of a target compiled as one
# translation unit) for the CPU targets, set in one place: moebatch_unity_build(), called at the
# end of the top-level CMakeLists.txt once every target exists.
#
# Why: most of a source file's compile time here is the code generated for the same third-party
# templates (nlohmann/json, spdlog/fmt, GoogleTest, Boost.Asio/Beast), once in every file that
# uses them (parsing the headers is only 15-30% of the slowest files' time); a unity build
# generates it once per batch. Measured from clean on the 2-core machine (docs/reliability.md,
# "Build time"): the plain CPU build 833 -> 460 s, the ASan + UBSan build 1,336 -> 674 s. It pays
# on a whole build, but an edit recompiles its whole batch, so it is off by default and on in CI
# (.ci/run) and scripts/sanitize.sh.
# Constraint: file-local names (anonymous namespaces, statics) must be unique within a target; a
# clash fails the unity build only.
#
# Precompiled headers were measured too and are not used: on top of unity they saved 4.5% of the
# plain build (460 -> 439 s), and GCC 12 (CI's compiler) does not keep `#pragma GCC diagnostic`
# state in a PCH, so libstdc++'s own suppressed false positives (-Warray-bounds in
# char_traits.h, inlined into std::string concatenations) came back, errors under MOEBATCH_WERROR.
#
# Only the CPU directories below take part: the CUDA side (kernels, engine/cuda, tests/gpu,
# bench/gpu, whose sources are not checked for unity clashes) and the fuzz targets keep per-file
# builds.
option(MOEBATCH_UNITY "Unity builds (up to 8 sources a translation unit) for the CPU targets" OFF)

set(MOEBATCH_UNITY_DIRS
  common engine engine/tokenizer queue queue/zmq service cli
  tests/common tests/engine tests/queue tests/zmq tests/tokenizer tests/service
  bench/engine bench/queue bench/zmq bench/tokenizer bench/service bench/offline)

function(moebatch_unity_build)
  if(NOT MOEBATCH_UNITY)
    return()
  endif()
  # Every directory CMake processed (bench/ or tests/ may be off), matched against the list.
  set(pending "${PROJECT_SOURCE_DIR}")
  while(pending)
    list(POP_FRONT pending dir)
    get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    list(APPEND pending ${subdirs})
    file(RELATIVE_PATH rel "${PROJECT_SOURCE_DIR}" "${dir}")
    if(NOT rel IN_LIST MOEBATCH_UNITY_DIRS)
      continue()
    endif()
    get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t IN LISTS targets)
      get_target_property(type ${t} TYPE)
      if(type MATCHES "^(STATIC_LIBRARY|EXECUTABLE)$")
        set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
      endif()
    endforeach()
  endwhile()
endfunction()
