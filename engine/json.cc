// The JSON parser of json.h. Layer: engine (host-only).
#include "json.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <set>

#include "gqattn/error.h"

namespace gqattn::engine {

namespace {

// A safetensors header nests three deep (tensors -> entry -> shape), a config.json about as much;
// deeper is a corrupt file, and a bound keeps the recursive parser off the end of the stack.
constexpr int kMaxJsonDepth = 64;
// Values in a document, at most: a checkpoint has a few per tensor (name, dtype, shape, offsets) and
// some thousands of tensors; the bound keeps a hostile header of 100 MB of "0," (~96 bytes a parsed
// value) from taking gigabytes.
constexpr int64_t kMaxJsonValues = int64_t(1) << 20;

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& context) : s_(text), context_(context) {}

  Json parse_document() {
    Json v = parse_value();
    skip_space();
    if (pos_ != s_.size()) fail("trailing characters after the document");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(context_ + " at byte " + std::to_string(pos_) + ": " + what);
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  char peek() {
    skip_space();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  Json parse_value() {
    if (++values_ > kMaxJsonValues) fail("more than " + std::to_string(kMaxJsonValues) + " values");
    const char c = peek();
    if (c == '{' || c == '[') {
      if (++depth_ > kMaxJsonDepth) fail("nested deeper than " + std::to_string(kMaxJsonDepth));
      Json v = c == '{' ? parse_object() : parse_array();
      --depth_;
      return v;
    }
    if (c == '"') {
      Json v;
      v.kind = Json::Kind::kString;
      v.str = parse_string();
      return v;
    }
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return parse_number();
    if (s_.compare(pos_, 4, "null") == 0) {
      pos_ += 4;
      return Json();
    }
    for (const bool b : {true, false}) {
      const char* word = b ? "true" : "false";
      if (s_.compare(pos_, std::strlen(word), word) == 0) {
        pos_ += std::strlen(word);
        Json v;
        v.kind = Json::Kind::kBool;
        v.boolean = b;
        return v;
      }
    }
    fail(std::string("unexpected character '") + c + "'");
  }
  Json parse_object() {
    Json v;
    v.kind = Json::Kind::kObject;
    expect('{');
    if (peek() == '}') {
      ++pos_;
      return v;
    }
    std::set<std::string> names;
    while (true) {
      if (peek() != '"') fail("expected a member name");
      std::string key = parse_string();
      if (!names.insert(key).second) fail("duplicate member name '" + key + "'");
      expect(':');
      v.members.emplace_back(std::move(key), parse_value());
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return v;
    }
  }
  Json parse_array() {
    Json v;
    v.kind = Json::Kind::kArray;
    expect('[');
    if (peek() == ']') {
      ++pos_;
      return v;
    }
    while (true) {
      v.items.push_back(parse_value());
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return v;
    }
  }
  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': case '\\': case '/': out += e; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': append_utf8(out, parse_code_point()); break;
        default: fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }
  // Four hex digits.
  unsigned parse_hex4() {
    unsigned code = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char h = pos_ < s_.size() ? s_[pos_] : '\0';
      if (!std::isxdigit(static_cast<unsigned char>(h))) fail("bad \\u escape");
      code = code * 16 + unsigned(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return code;
  }
  // The code point of a \u escape (its "\u" read), a UTF-16 surrogate pair joined.
  unsigned parse_code_point() {
    const unsigned code = parse_hex4();
    if (code < 0xD800 || code >= 0xE000) return code;
    if (code >= 0xDC00 || s_.compare(pos_, 2, "\\u") != 0) fail("unpaired surrogate in a \\u escape");
    pos_ += 2;
    const unsigned low = parse_hex4();
    if (low < 0xDC00 || low >= 0xE000) fail("unpaired surrogate in a \\u escape");
    return 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
  }
  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += char(code);
    } else if (code < 0x800) {
      out += char(0xC0 | (code >> 6));
      out += char(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += char(0xE0 | (code >> 12));
      out += char(0x80 | ((code >> 6) & 0x3F));
      out += char(0x80 | (code & 0x3F));
    } else {
      out += char(0xF0 | (code >> 18));
      out += char(0x80 | ((code >> 12) & 0x3F));
      out += char(0x80 | ((code >> 6) & 0x3F));
      out += char(0x80 | (code & 0x3F));
    }
  }
  Json parse_number() {
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '-' ||
                                s_[pos_] == '+' || s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      ++pos_;
    Json v;
    v.kind = Json::Kind::kNumber;
    size_t used = 0;
    try {
      v.number = std::stod(s_.substr(start, pos_ - start), &used);
    } catch (const std::exception&) {
      fail("bad number");
    }
    if (used != pos_ - start) fail("bad number");
    return v;
  }

  const std::string& s_;
  std::string context_;
  size_t pos_ = 0;
  int depth_ = 0;
  int64_t values_ = 0;
};

}  // namespace

const Json* Json::find(const std::string& name) const {
  for (const auto& [key, value] : members)
    if (key == name) return &value;
  return nullptr;
}

std::optional<int64_t> Json::integer() const {
  // Integers below 2^53 are exact in the parser's double; no offset, dimension or count is larger.
  constexpr double kMaxExact = 9007199254740992.0;
  if (kind != Kind::kNumber || std::fabs(number) >= kMaxExact || number != std::floor(number)) return std::nullopt;
  return int64_t(number);
}

Json parse_json(const std::string& text, const std::string& context) {
  return JsonParser(text, context).parse_document();
}

}  // namespace gqattn::engine
