#!/usr/bin/env bash
# `make install`'s system packages, when we can install them (root and apt): each one the tool or its tests
# use, checked, and the missing ones installed in one apt-get call. Without root or apt it only says what is
# missing; the features and tests that need them are then unavailable (each says so in one line).
#   libaio-dev        DeepSpeed's async_io op: NVMe offload
#   numactl           DeepSpeed's --bind_cores_to_rank (on by default when the optimizer is offloaded)
#   pdsh, openssh-server   several machines: DeepSpeed's pdsh runner over ssh; the two-node test starts an sshd
#   slurmctld, slurmd, slurm-client, munge   the one-node Slurm the --sbatch / --launcher slurm test starts
set -u
missing=()
dpkg -s libaio-dev >/dev/null 2>&1 || missing+=(libaio-dev)
command -v numactl >/dev/null || missing+=(numactl)
command -v pdsh >/dev/null || missing+=(pdsh)
command -v sshd >/dev/null || test -x /usr/sbin/sshd || missing+=(openssh-server)
command -v slurmctld >/dev/null || missing+=(slurmctld slurmd slurm-client munge)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${missing[*]}"
    if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null); then
        echo "warning: could not install ${missing[*]}; NVMe offload, core binding, multi-node or Slurm may be unavailable"
    fi
else
    echo "note: ${missing[*]} missing (install them as root for NVMe offload, core binding, multi-node and Slurm)"
fi
exit 0
