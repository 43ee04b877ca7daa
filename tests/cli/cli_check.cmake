# Runs a command-line tool (gqattn-bench, gqattn-serve) for a CLI test (cmake -P): -DCLI=binary -DARGS=a|b|c -DEXPECT=ok|fail
# -DREGEX=pattern. Passes when the exit code is zero (ok) or non-zero (fail) and the combined
# stdout + stderr matches REGEX.
string(REPLACE "|" ";" arg_list "${ARGS}")
execute_process(COMMAND ${CLI} ${arg_list}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(all "${out}${err}")
message("${CLI} ${arg_list}\nexit code: ${rc}\n${all}")
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "${CLI} did not exit normally: ${rc}")
endif()
if(EXPECT STREQUAL "ok" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "expected exit code 0, got ${rc}")
endif()
if(EXPECT STREQUAL "fail" AND rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit code, got 0")
endif()
if(NOT all MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match '${REGEX}'")
endif()
