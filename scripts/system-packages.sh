#!/bin/sh
# Make sure the system packages scaffold needs are installed: what `make setup` runs.
#
#   scripts/system-packages.sh PACKAGE:COMMAND ...
#
# Each argument names a Debian package and a command it provides (bubblewrap:bwrap). The list itself
# is SYSTEM_PACKAGES in the Makefile. A package counts as present when its command is on PATH, so the
# check is quick and also right on other distributions. Missing ones are installed with apt-get when
# this runs as root on a system that has it; otherwise the script says what to install and goes on
# (exit status 0: the rest of the setup does not need them).
set -eu

missing=""
for spec in "$@"; do
    package=${spec%%:*}
    command=${spec#*:}
    if ! command -v "$command" >/dev/null 2>&1; then
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
