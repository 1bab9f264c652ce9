#!/bin/bash
# usage: tests.sh PATH_TO_CALC
c=$1; fail=0
check() { out=$("$c" "${@:2}" 2>/dev/null); [ "$out" = "$1" ] || { echo "FAIL: calc ${*:2} -> '$out' (want '$1')"; fail=1; }; }
check 7 add 3 4
check 2.5 div 5 2
check 1024 pow 2 10
check 1.41421 sqrt 2
check -3 neg 3
"$c" div 1 0 >/dev/null 2>&1 && { echo "FAIL: div by zero must fail"; fail=1; }
[ $fail = 0 ] && echo "all tests passed"
exit $fail
