#!/bin/bash
set -euo pipefail
cd /app/calc
cat > Makefile <<'MK'
CC = gcc
CFLAGS = -Wall -O2 -Isrc
LDLIBS = -lm
SRCS = $(wildcard src/*.c)
OBJS = $(patsubst src/%.c,build/%.o,$(SRCS))

all: build/calc

build/calc: $(OBJS)
	$(CC) $(CFLAGS) -o $@ $(OBJS) $(LDLIBS)

build/%.o: src/%.c | build
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

build:
	mkdir -p build

-include $(OBJS:.o=.d)

test: build/calc
	./tests.sh build/calc

clean:
	rm -rf build

.PHONY: all test clean
MK
make clean && make && make test
