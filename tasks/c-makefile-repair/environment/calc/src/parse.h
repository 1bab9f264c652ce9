#ifndef PARSE_H
#define PARSE_H
int parse_number(const char *s, double *out);
#endif
