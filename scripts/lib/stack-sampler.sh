#!/bin/sh
# Runs inside the emulated host (scripts/emulated-host.sh), beside a
# benchmark: samples the kernel stacks of pagefold's threads and of the
# kernel's memory threads (khugepaged, kcompactd, kswapd) as fast as
# busybox sh can (every 30-100 ms under emulation), to find what a guest
# that woke late waited for. Pass it with --file and start it in the
# background (docs/linux-guests.md, "The guests' worst wake-ups"):
#
#   sh /in/stack-sampler.sh /out/samples.log &
#
# Each sample of a thread that is neither running nor idle is one line,
# "uptime /proc/PID/task/TID comm top-frame", then its stack's first 8
# frames. The first line maps uptime to wall-clock time (whole seconds).
# The kernel leaves scheduler functions out of another task's stack, so
# a thread waiting for a lock shows the lock's caller on top; a running
# thread has no stack to show and is left out.
set -u
OUT=${1:-/out/stack-samples.log}
echo "start epoch $(date +%s) uptime $(cut -d' ' -f1 /proc/uptime)" >"$OUT"
tasks=""
refresh=0
while :; do
    # New threads (a VM's vCPUs, a device's) are found every 20 samples.
    if [ "$refresh" -le 0 ]; then
        tasks=""
        for p in /proc/[0-9]*; do
            read -r c <"$p/comm" 2>/dev/null || continue
            case $c in
            pagefold* | khugepaged | kcompactd* | kswapd*) tasks="$tasks $(echo "$p"/task/*)" ;;
            esac
        done
        refresh=20
    fi
    refresh=$((refresh - 1))
    read -r up _ </proc/uptime
    for t in $tasks; do
        w=""
        read -r w <"$t/stack" 2>/dev/null || continue
        w=${w#*] }
        w=${w%%+*}
        case $w in
        "" | kvm_vcpu_block | kvm_vcpu_halt | do_epoll_wait | do_sys_poll | futex_wait_queue | \
            hrtimer_nanosleep | do_nanosleep | khugepaged | kcompactd | kswapd | do_select | \
            pipe_read | do_wait) continue ;;
        esac
        read -r c <"$t/comm"
        echo "$up $t $c $w" >>"$OUT"
        head -8 "$t/stack" 2>/dev/null | sed 's/^/    /' >>"$OUT"
    done
done
