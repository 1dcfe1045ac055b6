# Sourced by the fetch-*.sh scripts: apt-get options for a private apt configuration
# under a cache directory, so other Debian releases' and architectures' packages are
# downloaded without touching the host's apt sources, state or dpkg architectures.
#   private_apt ROOT ARCHS   (ARCHS comma-separated); sets the array apt_opts.
#   Write ROOT/etc/sources.list, then: apt-get "${apt_opts[@]}" update
private_apt() {
  local root=$1 archs=$2
  mkdir -p "$root"/{lists/partial,archives/partial,etc/preferences.d,state}
  : > "$root/state/status"
  apt_opts=(
    -o "Dir::Etc::sourcelist=$root/etc/sources.list"
    -o "Dir::Etc::sourceparts=-"
    -o "Dir::Etc::preferencesparts=$root/etc/preferences.d"
    -o "Dir::State::lists=$root/lists"
    -o "Dir::State::status=$root/state/status"
    -o "Dir::Cache::archives=$root/archives"
    -o "Dir::Cache=$root"
    -o "APT::Architectures=$archs"
    -o "Acquire::Languages=none"
    -o "Debug::NoLocking=1"
    -o "APT::Sandbox::User=root"
  )
}
