#include <stdlib.h>
#include "parse.h"

int parse_number(const char *s, double *out) {
    char *end;
    if (!s || !*s) return 0;
    *out = strtod(s, &end);
    return *end == '\0';
}
