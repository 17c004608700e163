# normlab_find_python(): decides NORMLAB_BUILD_PYTHON from NORMLAB_PYTHON (AUTO, ON, OFF): the
# package needs a Python interpreter with its development headers and nanobind importable by that
# interpreter (`pip install nanobind`; ./setup.sh puts both in .venv). AUTO builds it where they
# are found; ON makes their absence an error. NORMLAB_PYTHON_WHY says what was found.
# Python_EXECUTABLE picks the interpreter (scikit-build-core sets it for `pip install .`). A macro,
# so that find_package(Python)'s results reach python/CMakeLists.txt.
macro(normlab_find_python)
  set(normlab_py_build OFF)
  set(normlab_py_why "(NORMLAB_PYTHON=OFF)")
  if(NOT NORMLAB_PYTHON STREQUAL "OFF")
    find_package(Python 3.10 COMPONENTS Interpreter Development.Module)
    if(NOT Python_FOUND)
      set(normlab_py_why "(no Python 3.10+ interpreter with development headers; on Debian: apt-get install python3-dev)")
    else()
      execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                      OUTPUT_VARIABLE normlab_nanobind_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE normlab_py_status
                      ERROR_QUIET)
      if(normlab_py_status EQUAL 0 AND EXISTS "${normlab_nanobind_dir}")
        set(nanobind_DIR "${normlab_nanobind_dir}" CACHE PATH "nanobind's CMake package (python -m nanobind --cmake_dir)" FORCE)
        set(normlab_py_build ON)
        set(normlab_py_why "(${Python_EXECUTABLE}, Python ${Python_VERSION}, nanobind from ${normlab_nanobind_dir})")
      else()
        set(normlab_py_why "(${Python_EXECUTABLE} cannot import nanobind: pip install nanobind, or ./setup.sh python)")
      endif()
    endif()
  endif()
  if(NORMLAB_PYTHON STREQUAL "ON" AND NOT normlab_py_build)
    message(FATAL_ERROR "NORMLAB_PYTHON=ON but the Python package cannot be built ${normlab_py_why}")
  endif()
  set(NORMLAB_BUILD_PYTHON ${normlab_py_build})
  set(NORMLAB_PYTHON_WHY "${normlab_py_why}")
endmacro()
