// The tests' check of a rejection: a call throws gqattn::Error and its message names what it
// should. Layer: tests (host-only, GoogleTest).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "gqattn/error.h"

namespace gqattn::test {

// `call` throws a gqattn::Error whose message contains every needle (a failure of the test
// otherwise); returns the message ("" when nothing was thrown).
inline std::string expect_rejected(const std::function<void()>& call, std::initializer_list<std::string> needles) {
  std::string message;
  bool threw = false;
  try {
    call();
  } catch (const Error& e) {
    threw = true;
    message = e.what();
  }
  EXPECT_TRUE(threw) << "expected a gqattn::Error naming: " << *needles.begin();
  if (!threw) return message;
  for (const std::string& needle : needles)
    EXPECT_NE(message.find(needle), std::string::npos) << "message: " << message << "\nmissing: " << needle;
  return message;
}

}  // namespace gqattn::test
