# Sourced by dev/fetch-*.sh: a private apt configuration under one directory, so packages
# of other Debian releases or architectures are downloaded without touching the host's
# apt state. Usage: private_apt APT_ROOT ARCHS SUITE... ; then apt-get "${apt_opts[@]}" ...
private_apt() {
  local apt_root=$1 archs=$2
  shift 2
  mkdir -p "$apt_root"/{lists/partial,archives/partial,etc/preferences.d,state}
  : > "$apt_root/etc/sources.list"
  for suite in "$@"; do
    echo "deb [trusted=yes] http://deb.debian.org/debian $suite main" >> "$apt_root/etc/sources.list"
  done
  : > "$apt_root/state/status"
  apt_opts=(
    -o "Dir::Etc::sourcelist=$apt_root/etc/sources.list"
    -o "Dir::Etc::sourceparts=-"
    -o "Dir::Etc::preferencesparts=$apt_root/etc/preferences.d"
    -o "Dir::State::lists=$apt_root/lists"
    -o "Dir::State::status=$apt_root/state/status"
    -o "Dir::Cache::archives=$apt_root/archives"
    -o "Dir::Cache=$apt_root"
    -o "APT::Architectures=$archs"
    -o "Acquire::Languages=none"
    -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
  )
}
