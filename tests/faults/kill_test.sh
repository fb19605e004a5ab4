#!/usr/bin/env bash
# A rank killed inside its forward (SIGKILL from the test's cblas_sgemm) under
# mpirun --enable-recovery, so that the job outlives it: the 3 survivors must each return
# RINGATTN_ERR_COMM within the deadline and tear down cleanly (test_faults_mpi's kill_run).
# usage: kill_test.sh MPIEXEC TEST_FAULTS_MPI
set -uo pipefail
mpiexec="$1" exe="$2"
out="$(RATEST_FAULT_KILL=1 timeout 120 "$mpiexec" -n 4 --oversubscribe --allow-run-as-root \
        --enable-recovery -x RATEST_FAULT_KILL "$exe" 2>&1)"
echo "$out"
survivors="$(grep -c '^SURVIVOR_OK' <<<"$out")"
echo "kill_test: $survivors of 3 survivors ok"
! grep -q 'WRONG DATA' <<<"$out" && [[ "$survivors" -eq 3 ]]
