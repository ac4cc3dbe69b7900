#!/bin/sh
# Runs inside the emulated host (scripts/emulated-host.sh --stall-trace):
# finds a Linux build guest that stopped and records what its vCPU does.
#
#   stall-watch.sh SECS
#
# Every 30 s it looks at the build benchmark's consoles
# (/scratch/pagefold-linux-build-*/*.console; a console with the result
# line is done). One that has not grown for SECS gets two 2 s samples of
# KVM's trace events (/out/stall-N-R.trace, summed by vCPU thread, exit
# reason and guest RIP, and the nested page faults by address), the
# kernel stacks of pagefold's threads, and a copy of the consoles in
# /out; then pagefold is stopped so that the run ends and /out comes
# back. Busybox sh only.
set -u
STALL=${1:?usage: stall-watch.sh SECS}
T=/sys/kernel/tracing
if [ ! -d $T/events ]; then
    mount -t tracefs none $T 2>/dev/null || { mkdir -p /tr && mount -t tracefs none /tr && T=/tr; }
fi
echo "stall-watch: consoles silent for ${STALL} s are traced (tracefs at $T)"
mkdir -p /tmp/stall-watch
n=0
while sleep 30; do
    for f in /scratch/pagefold-linux-build-*/*.console; do
        [ -f "$f" ] || continue
        grep -q PAGEFOLD-BUILD-RESULT "$f" && continue
        k=/tmp/stall-watch/$(echo "$f" | tr '/' '_')
        s=$(wc -c <"$f")
        old=$(cat "$k.size" 2>/dev/null || echo -1)
        age=$(cat "$k.age" 2>/dev/null || echo 0)
        if [ "$s" = "$old" ]; then age=$((age + 30)); else age=0; fi
        echo "$s" >"$k.size"
        echo "$age" >"$k.age"
        [ "$age" -ge "$STALL" ] || continue
        n=$((n + 1))
        echo "== stall-watch: $f silent for ${age} s: $(tail -n 1 "$f" | cut -c1-100)"
        for round in 1 2; do
            out=/out/stall-$n-$round.trace
            echo >$T/trace
            echo 1 >$T/events/kvm/enable
            sleep 2
            echo 0 >$T/events/kvm/enable
            cp $T/trace "$out"
            echo "-- sample $round: $(wc -l <"$out") events; exits by thread, reason, RIP:"
            grep -o '[a-z-]*vcpu[0-9]*-[0-9]* .*kvm_exit: vcpu [0-9]* reason [A-Za-z_]* rip 0x[0-9a-f]*' "$out" |
                sed 's/ *\[.*kvm_exit//' | sort | uniq -c | sort -rn | head -15
            echo "-- nested page faults by RIP, address, error code:"
            grep -o 'kvm_page_fault: .*' "$out" | cut -d' ' -f2- | sort | uniq -c | sort -rn | head -10
            for t in /proc/[0-9]*/task/*; do
                case $(cat "$t/comm" 2>/dev/null) in
                pagefold* | *vcpu* | *scan* | *uffd*)
                    echo "-- $t $(cat "$t/comm") state $(cut -d' ' -f3 "$t/stat")"
                    head -8 "$t/stack" 2>/dev/null
                    ;;
                esac
            done
            sleep 5
        done
        cp /scratch/pagefold-linux-build-*/*.console /out/ 2>/dev/null
        for p in /proc/[0-9]*; do
            case $(cat "$p/comm" 2>/dev/null) in
            pagefold*) kill "${p#/proc/}" 2>/dev/null ;;
            esac
        done
        exit 0
    done
done
