# Where `install` puts the CLI, the recorder's libraries and the Python package, relative to the
# install prefix. A `cmake --install` (C++ users, packagers) lays them out as a Unix prefix:
# bin/torchrr, lib/libtorchrr_*.so, lib/torchrr/python/torchrr. A wheel (pip install,
# pyproject.toml; the prefix is site-packages) keeps everything inside the importable package:
# torchrr/bin/torchrr, torchrr/lib/libtorchrr_*.so, torchrr/__init__.py.
# The CLI finds the libraries and the package from its own path through the two relative paths
# at the end (replayer/cli/record_command.cc); the package finds the libraries from its own
# (recorder/python/torchrr/_native.py).
include(GNUInstallDirs)
if(TORCHRR_WHEEL)
  set(TORCHRR_INSTALL_BINDIR torchrr/bin)
  set(TORCHRR_INSTALL_LIBDIR torchrr/lib)
  set(TORCHRR_INSTALL_PACKAGE_PARENT .)
else()
  set(TORCHRR_INSTALL_BINDIR ${CMAKE_INSTALL_BINDIR})
  set(TORCHRR_INSTALL_LIBDIR ${CMAKE_INSTALL_LIBDIR})
  set(TORCHRR_INSTALL_PACKAGE_PARENT ${CMAKE_INSTALL_LIBDIR}/torchrr/python)
endif()
file(RELATIVE_PATH TORCHRR_LIBDIR_FROM_BINDIR /prefix/${TORCHRR_INSTALL_BINDIR}
     /prefix/${TORCHRR_INSTALL_LIBDIR})
file(RELATIVE_PATH TORCHRR_PACKAGE_FROM_LIBDIR /prefix/${TORCHRR_INSTALL_LIBDIR}
     /prefix/${TORCHRR_INSTALL_PACKAGE_PARENT}/torchrr)
if(TORCHRR_PACKAGE_FROM_LIBDIR STREQUAL "")
  set(TORCHRR_PACKAGE_FROM_LIBDIR .)
endif()
