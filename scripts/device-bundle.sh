#!/usr/bin/env bash
# Gathers what a bare GPU machine (an Ubuntu-based CUDA image: libc, libstdc++, a C compiler, nvcc,
# CMake, ninja and Python, nothing else we need, no network) lacks to build and run tycho: Lua 5.4,
# Open MPI with the PMIx it starts its ranks through, the OpenMP build of OpenBLAS, oneDNN (the
# CPU's bf16 products), readline, pkg-config and their runtime libraries. They are Debian 12's packages (apt-get download, dpkg -x)
# unpacked into one relocatable prefix, device-bundle/, trimmed to what one node needs, and packed
# into device-bundle/bundle.tar.xz (under 32 MiB) with device-bundle/env.sh, which sets the paths
# for wherever the archive is unpacked. scripts/device-check.sh unpacks and uses it there.
# Run here (Debian 12, amd64, with apt's package lists): scripts/device-bundle.sh [--keep]
# Afterwards device-bundle/ holds the archive and PACKAGES.txt (what is in it and why) alone, so
# the folder can travel whole; --keep leaves the unpacked prefix beside them too.
# The dependency list is checked, not assumed: every package bundled has each of its dependencies
# (apt-cache depends) either bundled or named below with the reason it is not, else this fails.
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0
case "${1:-}" in
  --keep) keep=1 ;;
  "") ;;
  *) echo "usage: scripts/device-bundle.sh [--keep]" >&2; exit 2 ;;
esac
out=device-bundle
limit_mib=32
multiarch=x86_64-linux-gnu

die() { echo "device-bundle: $*" >&2; exit 1; }
[ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ] ||
  die "run this on an amd64 Debian 12 machine (the GPU machine is x86-64; Debian 12's packages are what it is tested with)"
grep -q '^VERSION_ID="12"' /etc/os-release 2>/dev/null ||
  echo "device-bundle: warning: not Debian 12; the package names below are Debian 12's" >&2
for tool in apt-get apt-cache dpkg-deb readelf tar xz; do
  command -v "$tool" >/dev/null || die "needs $tool"
done

# What is bundled: package|place|why. place "main": into the prefix, first in LD_LIBRARY_PATH;
# "fallback": a runtime library a CUDA image often has already (a compiler's, the system's):
# env.sh uses the bundle's copy only where the machine has none, so a newer one there is not
# shadowed by Debian 12's older one.
include=(
  "liblua5.4-0|main|Lua 5.4's library (liblua5.4.so.0): the plan language tycho embeds"
  "liblua5.4-dev|main|Lua 5.4's headers, liblua5.4.so and lua5.4.pc: CMake's pkg_check_modules(lua5.4)"
  "libopenblas0-openmp|main|OpenBLAS, its OpenMP build (the one scripts/install-deps.sh installs): the CPU kernels' matrix products, in libgomp's thread pool"
  "libopenblas-openmp-dev|main|that build's cblas.h, libopenblas.so and openblas.pc: CMake's pkg_check_modules(openblas)"
  "libopenblas0|main|the virtual OpenBLAS package the OpenMP build satisfies (no files of its own)"
  "libopenblas-dev|main|the development package the OpenMP one satisfies (no files of its own)"
  "libgfortran5|fallback|OpenBLAS's Fortran runtime (its LAPACK half is Fortran); images without gfortran lack it"
  "libquadmath0|fallback|libgfortran5's quad-precision library"
  "libgomp1|fallback|the OpenMP runtime of OpenBLAS's OpenMP build; gcc installs its own, used in its place"
  "libopenmpi3|main|Open MPI 4.1's libraries (libmpi, libopen-rte, libopen-pal) and the plugins one node uses: tycho's comm layer"
  "openmpi-bin|main|mpirun/mpiexec (orterun), orted, ompi_info and mpicc (opal_wrapper: CMake's FindMPI asks it for the flags)"
  "openmpi-common|main|Open MPI's help texts, mpicc's wrapper data and default MCA parameters, read at run time"
  "libopenmpi-dev|main|mpi.h and libmpi.so, to compile and link against Open MPI"
  "libpmix2|main|PMIx 4: Debian's Open MPI starts and wires up its ranks through it (mca_pmix_ext3x); libpmix links libmunge"
  "libmunge2|main|libpmix.so.2 links it (PMIx's munge authentication); no munge daemon is needed on one node"
  "libhwloc15|main|the hardware topology library libopen-pal and libpmix link"
  "libevent-core-2.1-7|main|the event loop of Open MPI's runtime and of PMIx"
  "libevent-pthreads-2.1-7|main|libevent's thread support, linked by Open MPI and PMIx"
  "libudev1|fallback|libhwloc15 links it; most images have it"
  "libdnnl2|main|oneDNN: the CPU's bf16 matrix products (precision.compute = \"bf16\"), the reference the GPU's bf16 run is held to"
  "libdnnl-dev|main|oneDNN's C headers and libdnnl.so: CMake's find_library(dnnl) (optional in the build)"
  "ocl-icd-libopencl1|fallback|the OpenCL loader libdnnl.so.2 links (its GPU engine, unused: tycho runs oneDNN on the CPU)"
  "libreadline8|fallback|readline: line editing in tycho repl (optional in the build; linked where found)"
  "libreadline-dev|main|readline's headers and libreadline.so: CMake's find_library(readline)"
  "pkgconf-bin|main|pkg-config itself (pkgconf): CMake's FindPkgConfig needs it, a bare image may lack it"
  "libpkgconf3|main|pkgconf's library"
  "pkgconf|main|pkgconf's compatibility links and default search paths"
  "pkg-config|main|the pkg-config command name CMake looks for"
)
# Dependencies of the packages above that are not bundled, and why.
exclude=(
  "libc6|the C library: every image has it (Debian 12 builds need glibc 2.36; Ubuntu 24.04 has 2.39)"
  "libc6-dev|the C library's headers: come with the image's C compiler"
  "libc-dev|virtual: libc6-dev"
  "libstdc++6|C++ runtime: every CUDA image has it (nvcc and PyTorch need it)"
  "libgcc-s1|GCC's runtime: every image has it"
  "gcc-12-base|Debian's GCC 12 base files (docs only); the fallback GCC runtime libraries need none of it"
  "zlib1g|zlib: every image has it (dpkg needs it)"
  "zlib1g-dev|zlib's headers: for linking Open MPI statically only"
  "libtinfo6|ncurses' terminfo library: every image has it (bash needs it)"
  "libncurses-dev|ncurses' headers: readline's headers do not include them; libreadline.so links libtinfo.so.6, which the image has"
  "readline-common|readline's default inputrc and docs: readline runs without them"
  "dpkg|the package manager, for readline's info-page hook: nothing is installed, only unpacked"
  "install-info|readline's info-page hook: nothing is installed, only unpacked"
  "libopenblas0-pthread|the pthread build of OpenBLAS: the OpenMP build is the one bundled"
  "libopenblas-pthread-dev|the pthread build's development files: the OpenMP build's are bundled"
  "libopenblas0-serial|the serial build of OpenBLAS: the OpenMP build is the one bundled"
  "libopenblas-serial-dev|the serial build's development files: the OpenMP build's are bundled"
  "libfabric1|OFI interconnects (InfiniBand, EFA, ...): one node talks over shared memory; the ofi plugins are removed"
  "libucx0|UCX interconnects: one node talks over shared memory; the ucx plugins are removed"
  "libibverbs1|InfiniBand verbs: one node has no fabric; the openib/verbs plugins are removed"
  "libibverbs-dev|InfiniBand headers: for building Open MPI's fabric plugins only"
  "libnl-3-200|netlink, for the verbs and reachable_netlink plugins: removed (one node)"
  "libpsm-infinipath1|QLogic PSM fabric: one node has none; the psm plugin is removed"
  "libpsm2-2|Intel Omni-Path PSM2 fabric: one node has none; the psm2 plugin is removed"
  "libhwloc-plugins|hwloc's optional PCI/OpenCL/CUDA/GL topology plugins: the core library finds the CPUs and caches without them"
  "libhwloc-dev|hwloc's headers: mpi.h does not include them"
  "libevent-dev|libevent's headers: mpi.h does not include them"
  "libpmix-dev|PMIx's headers: mpi.h does not include them"
  "libjs-jquery|JavaScript for Open MPI's HTML docs: not shipped"
  "libjs-jquery-ui|JavaScript for Open MPI's HTML docs: not shipped"
  "openssh-client|mpirun's rsh/ssh launcher for other nodes: one node forks its ranks locally"
  "ssh-client|virtual: openssh-client"
  "gfortran|Fortran compiler for Open MPI's Fortran bindings: tycho is C"
  "gfortran-12|Fortran compiler for Open MPI's Fortran bindings: tycho is C"
  "gfortran-mod-15|virtual: a Fortran compiler's module format, for the Fortran bindings"
  "flang-16|a Fortran compiler: not needed (see gfortran)"
  "flang-19|a Fortran compiler: not needed (see gfortran)"
  "flang-22|a Fortran compiler: not needed (see gfortran)"
  "gfortran-11|a Fortran compiler: not needed (see gfortran)"
)
# Sonames of libraries every target image has (the base of an Ubuntu CUDA image): a bundled ELF file
# may need these and nothing else from outside the bundle.
base_sonames=" libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 ld-linux-x86-64.so.2
  libstdc++.so.6 libgcc_s.so.1 libz.so.1 libtinfo.so.6 "

declare -A why place skip
for e in "${include[@]}"; do IFS='|' read -r p w r <<<"$e"; place[$p]=$w why[$p]=$r; done
for e in "${exclude[@]}"; do IFS='|' read -r p r <<<"$e"; skip[$p]=$r; done

# 1. The dependency closure: one group per line ("a b" = a or b; a virtual package followed by
# its providers), each group satisfied by a bundled or an excluded package.
dep_groups() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances "$1" | awk '
    /^ [ |](Pre)?Depends: / { bar = ($1 ~ /^\|/); name = $2
      if (cur != "" && !prev_bar) { print cur; cur = "" }
      cur = cur (cur == "" ? "" : " ") name; prev_bar = bar; next }
    /^    [^ ]/ { cur = cur " " $1 }
    END { if (cur != "") print cur }' | tr -d '<>' | sed 's/:any//g'
}
unclassified=()
deps_report=""
for e in "${include[@]}"; do
  p=${e%%|*}
  apt-cache show "$p" >/dev/null 2>&1 || die "apt knows no package $p (run apt-get update)"
  while read -r group; do
    [ -n "$group" ] || continue
    hit=""
    for alt in $group; do
      if [ -n "${place[$alt]:-}" ]; then hit="$alt (bundled)"; break; fi
    done
    if [ -z "$hit" ]; then
      for alt in $group; do
        if [ -n "${skip[$alt]:-}" ]; then hit="$alt (not bundled: ${skip[$alt]})"; break; fi
      done
    fi
    [ -n "$hit" ] || unclassified+=("$group (a dependency of $p)")
    deps_report+="#   $p -> ${hit:-?}"$'\n'
  done < <(dep_groups "$p")
done
[ ${#unclassified[@]} -eq 0 ] || {
  printf 'device-bundle: unclassified dependency: %s\n' "${unclassified[@]}" >&2
  die "add each to the include (bundled) or exclude (with the reason) list of $0"
}

# 2. Download and unpack.
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
names=()
for e in "${include[@]}"; do names+=("${e%%|*}"); done
(cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "${names[@]}") ||
  die "apt-get download failed (run apt-get update?)"
rm -rf "$out"
mkdir -p "$out" "$tmp/fb"
lib=$out/usr/lib/$multiarch
manifest=$out/PACKAGES.txt
{
  echo "# tycho's device bundle: Debian 12 packages unpacked into this prefix (scripts/device-bundle.sh)."
  echo "# package version place: why"
} >"$manifest"
for e in "${include[@]}"; do
  IFS='|' read -r p w r <<<"$e"
  deb=$(ls "$tmp/${p}_"*.deb)
  v=$(dpkg-deb -f "$deb" Version)
  printf '%s %s %s: %s\n' "$p" "$v" "$w" "$r" >>"$manifest"
  if [ "$w" = main ]; then dpkg-deb -x "$deb" "$out"; else dpkg-deb -x "$deb" "$tmp/fb"; fi
done
{
  echo "# Not bundled:"
  for e in "${exclude[@]}"; do IFS='|' read -r p r <<<"$e"; echo "#   $p: $r"; done
  echo "# Each bundled package's dependencies, as apt-cache depends resolves them:"
  printf '%s' "$deps_report"
} >>"$manifest"

# Debian 12 still ships some libraries under /lib: one tree under usr/, as a merged-/usr system has.
merge_lib() { # ROOT
  if [ -d "$1/lib" ]; then
    mkdir -p "$1/usr/lib"
    cp -a "$1/lib/." "$1/usr/lib/"
    rm -rf "$1/lib"
  fi
}
merge_lib "$out"
merge_lib "$tmp/fb"
# The fallback packages' libraries, in a folder of their own (env.sh links the ones the machine lacks).
mkdir -p "$lib/fallback"
find "$tmp/fb/usr/lib" \( -type f -o -type l \) -name 'lib*.so*' -exec mv -t "$lib/fallback" {} +

# 3. Trim: documentation, static libraries, other languages' bindings and what one node does not
# run (fabric plugins, OpenSHMEM, Java, Fortran, LAPACK, the C++ Lua and oneDNN's C++ headers,
# Open MPI's internal headers).
rm -rf "$out"/usr/share/{doc,man,info,lintian,locale,aclocal,bug,lua5.4} "$lib/cmake" "$lib/fortran" \
  "$lib/openblas-openmp/cmake" "$out/etc/openmpi/openmpi-totalview.tcl" \
  "$out/usr/share/openmpi/amca-param-sets" "$lib/pmix2/share/pmix/pmix-valgrind.supp"
find "$out" \( -name '*.a' -o -name '*.la' \) -delete
rm -f "$lib"/openblas-openmp/{libblas,liblapack}.so* "$lib"/openblas-openmp/pkgconfig/{blas,lapack}-openblas.pc
rm -f "$out"/usr/include/*.hpp "$out"/usr/include/oneapi/dnnl/*.hpp
rm -f "$lib"/liblua5.4-c++* "$lib"/pkgconfig/lua*c++.pc
rm -f "$lib"/libmpi_java* "$lib"/libmpi_mpifh* "$lib"/libmpi_usempi* "$lib"/libmpi_cxx* "$lib"/liboshmem* \
  "$lib"/libompitrace* "$lib"/libmca_common_{ofi,ucx,verbs}* "$lib"/openmpi/lib/ompi_monitoring_prof.so
rm -f "$lib"/openmpi/lib/openmpi3/mca_{atomic,memheap,scoll,spml,sshmem}_*.so \
  "$lib"/openmpi/lib/openmpi3/mca_*_{ucx,ofi,psm,psm2,openib,usnic}.so
inc=$lib/openmpi/include
find "$inc/openmpi" -mindepth 1 -maxdepth 1 ! -name mpiext ! -name ompi -exec rm -rf {} +
find "$inc/openmpi/ompi" -mindepth 1 -maxdepth 1 ! -name mpi -exec rm -rf {} +
find "$inc/openmpi/ompi/mpi" -mindepth 1 -maxdepth 1 ! -name cxx -exec rm -rf {} +
rm -rf "$inc"/openshmem "$inc"/pshmem*.h "$inc"/shmem* "$inc"/mpif* "$inc"/*.mod
(cd "$out/usr/bin" && rm -f aggregate_profile profile2mat mpijavac* orte-server ompi-server orte-clean \
  ompi-clean oshmem_info osh* shmem* mpif77* mpif90* mpifort* mpiCC* mpic++* mpicxx* opalc++ ortecc)
# Debian's alternatives (made by its install scripts, which dpkg -x does not run) as links
for tool in mpicc mpirun mpiexec; do ln -sfn "$tool.openmpi" "$out/usr/bin/$tool"; done
# the OpenMP build's pkg-config file where pkg-config's default path finds it (as alternatives would)
cp "$lib/openblas-openmp/pkgconfig/openblas.pc" "$lib/pkgconfig/openblas.pc"
# luaconf.h includes this from the multiarch include folder, which the compiler there need not search
cp "$out/usr/include/$multiarch/lua5.4-deb-multiarch.h" "$out/usr/include/lua5.4/"

# Absolute links (Debian points lib*.so at /lib/...) into relative ones inside the prefix.
while IFS= read -r link; do
  target=$(readlink "$link")
  case "$target" in /lib/*) target=/usr$target ;; esac
  name=${target##*/}
  if [ -e "$out$target" ]; then
    ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$out$target")" "$link"
  elif [ -e "$lib/fallback/$name" ]; then
    ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$lib/fallback/$name")" "$link"
  else
    rm -f "$link"
  fi
done < <(find "$out" -type l -lname '/*')
find "$out" -xtype l -delete # links into what was trimmed

# pkg-config files: their /usr, relative to where each file lies, so the prefix can move.
while IFS= read -r pc; do
  rel=$(realpath --relative-to="$(dirname "$pc")" "$out/usr")
  sed -i -E "s#(^[a-z_]+=|-I|-L)/usr(/|\$)#\1\${pcfiledir}/$rel\2#g" "$pc"
done < <(find "$out" -name '*.pc')

# 4. Every ELF file needs only bundled libraries or the base image's; a plugin that needs more
# (a fabric's library) is removed, anything else is an error. Repeated: a removal can orphan another.
sonames_in_bundle() {
  find "$lib" "$lib/fallback" "$lib/openblas-openmp" "$lib/pmix2/lib" -maxdepth 1 \( -type f -o -type l \) \
    -name '*.so*' -printf '%f\n' | sort -u
}
removed=()
while :; do
  have=" $(sonames_in_bundle | tr '\n' ' ') $(echo $base_sonames) "
  changed=0
  while IFS= read -r f; do
    [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
    for need in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
      case "$have" in *" $need "*) continue ;; esac
      case "$f" in
        */openmpi3/mca_*.so | */pmix/pmix_mca_*.so) removed+=("${f#"$out"/} (needs $need)"); rm -f "$f"; changed=1; break ;;
        *) die "${f#"$out"/} needs $need, which is neither bundled nor in the base image" ;;
      esac
    done
  done < <(find "$out" -type f)
  [ $changed -eq 1 ] || break
done
[ ${#removed[@]} -eq 0 ] || printf 'device-bundle: removed plugin %s\n' "${removed[@]}"
find "$lib/fallback" -type f -name '*.so*' -exec readelf -d {} \; 2>/dev/null |
  sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p' | sort -u >"$lib/fallback/SONAMES"

# 5. env.sh: sourced from bash wherever the archive was unpacked.
cat >"$out/env.sh" <<'EOF'
# tycho's device bundle (scripts/device-bundle.sh): source it from bash, from where the archive
# was unpacked. Puts the prefix first in PATH, LD_LIBRARY_PATH, PKG_CONFIG_PATH and
# CMAKE_PREFIX_PATH, and moves Open MPI and PMIx to it: both were configured for /usr, and read
# their plugins, help texts and wrapper data from OPAL_PREFIX / PMIX_PREFIX when set.
# A fallback library (lib/x86_64-linux-gnu/fallback/SONAMES) is used only where the machine has
# none of that soname, so a newer one there (a compiler's libgomp, say) is not shadowed.
TYCHO_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export TYCHO_BUNDLE
tycho_bundle_lib=$TYCHO_BUNDLE/usr/lib/x86_64-linux-gnu
mkdir -p "$tycho_bundle_lib/fallback-active"
rm -f "$tycho_bundle_lib/fallback-active/"*
while read -r tycho_bundle_so; do
  tycho_bundle_sys=$(ldconfig -p 2>/dev/null | awk -v s="$tycho_bundle_so" '$1 == s && /x86-64/ { print $NF; exit }')
  if [ -z "$tycho_bundle_sys" ] || [ ! -f "$tycho_bundle_sys" ] || [ ! -s "$tycho_bundle_sys" ]; then
    ln -sfn "../fallback/$tycho_bundle_so" "$tycho_bundle_lib/fallback-active/$tycho_bundle_so"
  fi
done <"$tycho_bundle_lib/fallback/SONAMES"
export PATH=$TYCHO_BUNDLE/usr/bin:$PATH
export LD_LIBRARY_PATH=$tycho_bundle_lib:$tycho_bundle_lib/openblas-openmp:$tycho_bundle_lib/pmix2/lib:$tycho_bundle_lib/fallback-active${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$tycho_bundle_lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export CMAKE_PREFIX_PATH=$TYCHO_BUNDLE/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export OPAL_PREFIX=$TYCHO_BUNDLE/usr
export OPAL_SYSCONFDIR=$TYCHO_BUNDLE/etc/openmpi
export PMIX_PREFIX=$tycho_bundle_lib/pmix2
# Open MPI's own search path for its plugins, said outright (the relocation derives the same)
export OMPI_MCA_mca_base_component_path=$tycho_bundle_lib/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$tycho_bundle_lib/pmix2/lib/pmix
unset tycho_bundle_lib tycho_bundle_so tycho_bundle_sys
EOF

# 6. Pack.
tar -C "$out" --sort=name --owner=0 --group=0 --numeric-owner -cf - env.sh PACKAGES.txt usr etc |
  xz -9 -T2 >"$tmp/bundle.tar.xz"
mv "$tmp/bundle.tar.xz" "$out/bundle.tar.xz"
bytes=$(stat -c %s "$out/bundle.tar.xz")
unpacked=$(du -sb --exclude=bundle.tar.xz "$out" | cut -f1)
awk -v b="$bytes" -v u="$unpacked" -v n=${#include[@]} 'BEGIN {
  printf "device-bundle: %s/bundle.tar.xz: %.1f MiB (%d packages; %.1f MiB unpacked)\n", "'"$out"'", b / 1048576, n, u / 1048576 }'
[ "$bytes" -lt $((limit_mib * 1048576)) ] || die "the bundle is over $limit_mib MiB"
[ $keep -eq 1 ] || rm -rf "$out/usr" "$out/etc" "$out/env.sh"
