# Sourced by scripts/dev and scripts/test: the set-up a fresh Debian machine needs, as root.
# What berth and its tests use: unshare, nsenter, setpriv and losetup (util-linux, mount) to
# keep every mount in a private mount namespace; mkfs.ext4 and resize2fs (e2fsprogs) for
# berth-hostpath's image backing; curl for the README's API examples; protoc
# (protobuf-compiler), which the etcd client crate needs to build; etcd (etcd-server), which
# the fleet's tests and the README's fleet example run; podman and runc (the docker driver's
# container engine and OCI runtime) and busybox-static (what the docker tests' images hold);
# chromium and chromium-driver (chromedriver), the headless browser the web UI's tests drive.

if [ "$(id -u)" != 0 ]; then
  echo "berth makes real mounts: run this as root" >&2
  exit 1
fi

berth_need() { command -v "$1" >/dev/null 2>&1; }

# Installs, from Debian's packages, whatever of the tools above the machine lacks.
berth_install_missing() {
  local missing=() tool
  for tool in unshare nsenter setpriv; do berth_need "$tool" || missing+=(util-linux); done
  berth_need mount || missing+=(mount)
  berth_need losetup || missing+=(mount)
  berth_need mkfs.ext4 || missing+=(e2fsprogs)
  berth_need resize2fs || missing+=(e2fsprogs)
  berth_need curl || missing+=(curl)
  berth_need protoc || missing+=(protobuf-compiler)
  berth_need etcd || missing+=(etcd-server)
  berth_need podman || missing+=(podman)
  berth_need runc || [ -x /usr/sbin/runc ] || missing+=(runc)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  berth_need tar || missing+=(tar)
  berth_need chromium || missing+=(chromium)
  berth_need chromedriver || missing+=(chromium-driver)
  if [ "${#missing[@]}" -gt 0 ]; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    echo "installing: ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
