#!/bin/sh
# Make sure the system packages scaffold needs are installed: what `make setup` runs.
#
#   scripts/system-packages.sh PACKAGE:COMMAND ...
#
# Each argument names a Debian package and a command it provides (bubblewrap:bwrap), or a shared library
# it provides (libseccomp2:libseccomp.so.2). The list itself is SYSTEM_PACKAGES in the Makefile. A package
# counts as present when its command is on PATH, or its library is in the loader's cache (ldconfig -p), so
# the check is quick and also right on other distributions. Missing ones are installed with apt-get when
# this runs as root on a system that has it; otherwise the script says what to install and goes on
# (exit status 0: the rest of the setup does not need them).
set -eu

present() {
    case "$1" in
        *.so|*.so.*)
            for ldconfig in ldconfig /sbin/ldconfig /usr/sbin/ldconfig; do
                if command -v "$ldconfig" >/dev/null 2>&1; then
                    "$ldconfig" -p 2>/dev/null | grep -q "^[[:space:]]*$1 " && return 0
                    return 1
                fi
            done
            return 1 ;;
        *) command -v "$1" >/dev/null 2>&1 ;;
    esac
}

missing=""
for spec in "$@"; do
    package=${spec%%:*}
    command=${spec#*:}
    if ! present "$command"; then
        missing="$missing $package"
    fi
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "scaffold: installing system packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; then
        exit 0
    fi
    echo "scaffold: apt-get could not install:$missing" >&2
fi
echo "scaffold: missing system packages:$missing (SYSTEM_PACKAGES in the Makefile says what needs them)." \
     "Install them (Debian/Ubuntu: sudo apt-get install$missing; Fedora: sudo dnf install$missing);" \
     "until then what needs them refuses to run (the python tool without bubblewrap) or its tests fail in CI." >&2
exit 0
