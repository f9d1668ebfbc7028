# Sourced by tests/gpu/run.sh: makes the libraries of .gpu-deps/ (tools/gpu_bundle.sh) visible to
# CMake, the compilers and the programs built, for a machine that lacks them and cannot install
# them. Unpacks the .deb files into .gpu-deps/root (dpkg -x, or ar + tar where dpkg is missing).
# Does nothing when there is no bundle.
torchrr_use_gpu_deps() {
  local root=$1/.gpu-deps
  [ -d "$root/debs" ] || return 0
  if [ ! -f "$root/root/.unpacked" ]; then
    mkdir -p "$root/root"
    local deb
    for deb in "$root"/debs/*.deb; do
      if command -v dpkg >/dev/null; then
        dpkg -x "$deb" "$root/root"
      else
        (cd "$root/root" && ar p "$deb" "$(ar t "$deb" | grep '^data.tar')" | tar -x -J -f - 2>/dev/null ||
         ar p "$deb" "$(ar t "$deb" | grep '^data.tar')" | tar -x --zstd -f -)
      fi
    done
    touch "$root/root/.unpacked"
  fi
  local usr=$root/root/usr
  local lib=$usr/lib/x86_64-linux-gnu
  export CMAKE_PREFIX_PATH=$usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export PATH=$usr/bin:$PATH
  # After the compiler's own directories (-idirafter semantics are not available through the
  # environment; CPATH comes after -I but before the system directories).
  export CPATH=$usr/include:$root/extra/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$lib:$root/extra/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "deps: using the libraries bundled in $root"
}
