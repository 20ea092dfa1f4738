# What scripts/fetch-model.sh and scripts/fetch-gemma3.sh share (sourced, not run): the cache folder,
# the check of a cached file by size and sha256, a scratch folder in the cache, and the last check
# before a fetched file replaces the cached one.

cache="${KVSCHED_MODEL_CACHE:-$HOME/.cache/kvsched/models}"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

# fetch_cached FILE BYTES SHA: prints FILE and exits when it is there with that size and sha256.
fetch_cached() {
  if [ -f "$1" ] && [ "$(size_of "$1")" -eq "$2" ] && [ "$(sha_of "$1")" = "$3" ]; then
    echo "$1"
    exit 0
  fi
}

# fetch_workdir: a scratch folder in the cache (the same file system as the cache, so the last move is
# a rename), removed on exit; its path in $work.
fetch_workdir() {
  mkdir -p "$cache"
  work=$(mktemp -d "$cache/.fetch.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}

# fetch_install GOT FILE BYTES SHA WHAT: checks GOT's size and sha256 (WHAT names it in the error),
# moves it to FILE and prints FILE.
fetch_install() {
  local got_bytes got_sha
  got_bytes=$(size_of "$1")
  got_sha=$(sha_of "$1")
  if [ "$got_bytes" -ne "$3" ] || [ "$got_sha" != "$4" ]; then
    echo "$(basename "$0" .sh): $5: sha256 $got_sha ($got_bytes bytes), expected $4 ($3 bytes)" >&2
    exit 1
  fi
  mv -f "$1" "$2"
  echo "$2"
}
