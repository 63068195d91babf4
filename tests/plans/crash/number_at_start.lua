1 -- @error
-- A crash input the plan fuzzer found: a plan file that starts with a number made the
-- source-map lexer (host/lua/srcmap.c) read the byte before the file (ASan: heap-buffer-overflow).
-- expect: unexpected symbol near '1'
