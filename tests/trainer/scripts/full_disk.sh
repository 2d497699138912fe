#!/usr/bin/env bash
# A run on a real full disk: a 700 KiB tmpfs mounted at DISK in this process's own mount
# namespace (run it under `unshare -m` as root, or `unshare -rm`), then grown to 16 MiB
# ("room made") for the resume. Results land in OUT, outside the tmpfs, which ends with the namespace.
# usage: full_disk.sh DISK OUT PYTHON trainer-train-args...
set -u
disk=$1 out=$2 python=$3
shift 3
mount -t tmpfs -o size=700k tmpfs "$disk" || exit 77
"$python" -m trainer.entry train --output "$disk/run" "$@" >"$out/first.out" 2>"$out/first.err"
echo $? >"$out/first.rc"
ls "$disk/run/checkpoints" >"$out/first.checkpoints"
mount -o remount,size=16m "$disk" || exit 78
"$python" -m trainer.entry train --resume "$disk/run" --no-progress >"$out/resume.out" 2>"$out/resume.err"
echo $? >"$out/resume.rc"
cp "$disk/run/metrics.jsonl" "$out/metrics.jsonl"
