#include <stdio.h>
#include "ops.h"
#include "parse.h"

int main(int argc, char **argv) {
    double a = 0, b = 0;
    int ok;
    if (argc < 3) { fprintf(stderr, "usage: calc OP A [B]\n"); return 2; }
    int n = op_arity(argv[1]);
    if (argc != 2 + n || !parse_number(argv[2], &a) || (n == 2 && !parse_number(argv[3], &b))) {
        fprintf(stderr, "calc: bad arguments\n");
        return 2;
    }
    double r = op_apply(argv[1], a, b, &ok);
    if (!ok) { fprintf(stderr, "calc: error\n"); return 1; }
    printf("%.6g\n", r);
    return 0;
}
