#!/bin/sh
# Runs inside the emulated host (scripts/emulated-host.sh), beside a
# benchmark: once a pagefold process runs the dedup engine beside VMs
# (threads named pagefold-scan and *vcpu*), records the kernel's mmap_lock
# trace events of its threads, with their scheduling and KVM's nested page
# faults, for SECS seconds into /out/lock.trace (the earliest events are
# kept when the buffer fills). scripts/lib/mmap-lock-report.py reads it.
# Busybox sh.
#
#   sh /in/mmap-lock-trace.sh SECS &
set -u
SECS=${1:-40}
T=/sys/kernel/tracing
[ -d $T/events ] || mount -t tracefs none $T
while :; do
    for p in /proc/[0-9]*; do
        read -r c <"$p/comm" 2>/dev/null || continue
        case $c in pagefold) ;; *) continue ;; esac
        scan=""
        vcpu=""
        for t in "$p"/task/*; do
            read -r tc <"$t/comm" 2>/dev/null || continue
            case $tc in pagefold-scan) scan=1 ;; *vcpu*) vcpu=1 ;; esac
        done
        [ -n "$scan" ] && [ -n "$vcpu" ] || continue
        pids=""
        for t in "$p"/task/*; do pids="$pids ${t##*/}"; done
        echo 65536 >$T/buffer_size_kb
        echo 0 >$T/options/overwrite
        echo >$T/trace
        # Threads the listed ones start later are traced too.
        echo 1 >$T/options/event-fork
        echo "$pids" >$T/set_event_pid
        echo 1 >$T/events/mmap_lock/enable
        echo 1 >$T/events/sched/sched_switch/enable
        echo 1 >$T/events/sched/sched_wakeup/enable
        echo 1 >$T/events/kvm/kvm_page_fault/enable
        echo "mmap-lock-trace: tracing pid ${p##*/} at $(cut -d' ' -f1 /proc/uptime)"
        sleep "$SECS"
        echo 0 >$T/events/enable
        cp $T/trace /out/lock.trace
        echo "mmap-lock-trace: done, $(wc -l </out/lock.trace) lines"
        exit 0
    done
    sleep 0.5
done
