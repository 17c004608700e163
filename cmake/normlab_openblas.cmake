# Finds OpenBLAS for normlab and provides it as the target normlab::openblas. Used twice: by normlab's
# own CMakeLists.txt, and installed beside normlabConfig.cmake so that a project using
# find_package(normlab) finds the same kind of OpenBLAS again on its side.
#
# OpenBLAS built on OpenMP (Debian's libopenblas-openmp-dev) is preferred when it is installed: its
# gemms then run on the same OpenMP thread pool as normlab's own kernels. With the pthreads build, two
# pools claim every core and OpenBLAS's idle workers spin between calls (measured on 2 cores: the
# stability epoch 5.1 ms vs 3.0 ms with the OpenMP build). Debian installs either build as "openblas"
# through alternatives, so the OpenMP one is asked for by its own folder; the link gets an RPATH to
# that folder, so the binary loads it whichever build the alternatives point at.
# The search, first match wins:
# 1. cblas.h and libopenblas.so as files under CMAKE_PREFIX_PATH alone (the OpenMP build's folder
#    first): folders the user named come before the system's. That is how a machine with a CUDA
#    toolkit but no package registry builds against Debian's packages unpacked into a folder
#    (tests/cuda/stage_deps.sh, then tests/cuda/device_check.sh --deps), also where its image has an
#    OpenBLAS of its own (a pthreads build, whose openblas.pc pkg-config would find).
# 2. pkg-config's openblas.pc, the usual way on a Debian machine.
# 3. The same files under the system folders.
#
# normlab_find_openblas() sets, in the caller's scope:
#   NORMLAB_OPENBLAS_ERROR   "" when found, else why not (the caller decides how to fail)
#   NORMLAB_OPENBLAS_OPENMP  ON when the OpenMP build was found
#   NORMLAB_OPENBLAS_WHERE   the library found and how, for a status line

# normlab::openblas from a cblas.h folder and a libopenblas file; a macro, so that its PARENT_SCOPE
# results reach normlab_find_openblas()'s caller.
macro(normlab_openblas_from_files include_dir library how)
  add_library(normlab::openblas INTERFACE IMPORTED GLOBAL)
  target_include_directories(normlab::openblas INTERFACE "${include_dir}")
  target_link_libraries(normlab::openblas INTERFACE "${library}")
  set(openmp_build OFF)
  if("${library}" MATCHES "/openblas-openmp/")
    set(openmp_build ON)
  endif()
  set_target_properties(normlab::openblas PROPERTIES NORMLAB_OPENBLAS_OPENMP ${openmp_build})
  set(NORMLAB_OPENBLAS_OPENMP ${openmp_build} PARENT_SCOPE)
  set(NORMLAB_OPENBLAS_WHERE "${library}, cblas.h in ${include_dir} (found as files ${how})" PARENT_SCOPE)
endmacro()

function(normlab_find_openblas)
  set(NORMLAB_OPENBLAS_ERROR "" PARENT_SCOPE)
  set(openmp_build OFF)
  if(TARGET normlab::openblas)
    get_target_property(openmp_build normlab::openblas NORMLAB_OPENBLAS_OPENMP)
    set(NORMLAB_OPENBLAS_OPENMP ${openmp_build} PARENT_SCOPE)
    set(NORMLAB_OPENBLAS_WHERE "(found before)" PARENT_SCOPE)
    return()
  endif()

  # 1. Under CMAKE_PREFIX_PATH alone.
  if(CMAKE_PREFIX_PATH OR DEFINED ENV{CMAKE_PREFIX_PATH})
    set(prefix_only NO_PACKAGE_ROOT_PATH NO_SYSTEM_ENVIRONMENT_PATH NO_CMAKE_SYSTEM_PATH NO_CMAKE_INSTALL_PREFIX)
    # Own cache names: a header found here must not pair with a library found in step 3.
    find_path(NORMLAB_PREFIX_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-openmp openblas ${prefix_only})
    find_library(NORMLAB_PREFIX_OPENBLAS_LIBRARY openblas PATH_SUFFIXES openblas-openmp openblas ${prefix_only})
    if(NORMLAB_PREFIX_CBLAS_INCLUDE_DIR AND NORMLAB_PREFIX_OPENBLAS_LIBRARY)
      normlab_openblas_from_files("${NORMLAB_PREFIX_CBLAS_INCLUDE_DIR}" "${NORMLAB_PREFIX_OPENBLAS_LIBRARY}"
                                  "under CMAKE_PREFIX_PATH")
      return()
    endif()
  endif()

  # 2. pkg-config.
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    set(saved_pkg_config_path "$ENV{PKG_CONFIG_PATH}")
    set(openmp_pc_dir "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/pkgconfig")
    if(EXISTS "${openmp_pc_dir}/openblas.pc")
      set(ENV{PKG_CONFIG_PATH} "${openmp_pc_dir}:$ENV{PKG_CONFIG_PATH}")
      set(openmp_build ON)
    endif()
    # GLOBAL: the target is used from other folders (tests/, a parent project's add_subdirectory).
    pkg_check_modules(NORMLAB_OPENBLAS QUIET IMPORTED_TARGET GLOBAL openblas)
    set(ENV{PKG_CONFIG_PATH} "${saved_pkg_config_path}")
  endif()

  if(NORMLAB_OPENBLAS_FOUND)
    add_library(normlab::openblas INTERFACE IMPORTED GLOBAL)
    target_link_libraries(normlab::openblas INTERFACE PkgConfig::NORMLAB_OPENBLAS)
    set_target_properties(normlab::openblas PROPERTIES NORMLAB_OPENBLAS_OPENMP ${openmp_build})
    set(NORMLAB_OPENBLAS_OPENMP ${openmp_build} PARENT_SCOPE)
    set(NORMLAB_OPENBLAS_WHERE "${NORMLAB_OPENBLAS_LINK_LIBRARIES} (pkg-config)" PARENT_SCOPE)
    return()
  endif()

  # 3. The system folders (the OpenMP build's folder first, as above).
  find_path(NORMLAB_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-openmp openblas)
  find_library(NORMLAB_OPENBLAS_LIBRARY openblas PATH_SUFFIXES openblas-openmp openblas)
  if(NOT NORMLAB_CBLAS_INCLUDE_DIR OR NOT NORMLAB_OPENBLAS_LIBRARY)
    set(NORMLAB_OPENBLAS_ERROR
        "OpenBLAS not found: expected pkg-config's openblas.pc, or cblas.h and libopenblas.so under "
        "CMAKE_PREFIX_PATH (\"${CMAKE_PREFIX_PATH}\") or the system folders; found cblas.h: "
        "${NORMLAB_CBLAS_INCLUDE_DIR}, libopenblas: ${NORMLAB_OPENBLAS_LIBRARY}. On Debian: "
        "apt-get install libopenblas-openmp-dev (./setup.sh does)" PARENT_SCOPE)
    set(NORMLAB_OPENBLAS_OPENMP OFF PARENT_SCOPE)
    return()
  endif()
  normlab_openblas_from_files("${NORMLAB_CBLAS_INCLUDE_DIR}" "${NORMLAB_OPENBLAS_LIBRARY}" "in the system folders")
endfunction()
