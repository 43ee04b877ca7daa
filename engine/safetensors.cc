// The safetensors reader and writer, with the few JSON forms its header uses (objects, arrays,
// strings, integers). Layer: engine (host-only).
#include "safetensors.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "gqattn/error.h"

namespace gqattn::engine {

namespace {

// A header larger than this is a corrupt file, not a checkpoint.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;
// The writer pads the header with spaces so the data section starts at a multiple of this.
constexpr size_t kDataAlign = 8;
// A header nests three deep (tensors -> entry -> shape); deeper is a corrupt file, and a bound
// keeps the recursive parser off the end of the stack.
constexpr int kMaxJsonDepth = 64;
// Values in a header, at most: a checkpoint has a few per tensor (name, dtype, shape, offsets) and
// some thousands of tensors; the bound keeps a hostile header of 100 MB of "0," (~96 bytes a parsed
// value) from taking gigabytes.
constexpr int64_t kMaxJsonValues = int64_t(1) << 20;
// Integers below 2^53 are exact in the parser's double; no offset or dimension of a file is larger.
constexpr double kMaxJsonInteger = 9007199254740992.0;

struct Json {
  enum class Kind { kNull, kString, kNumber, kArray, kObject } kind = Kind::kNull;
  std::string str;
  double number = 0;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;
};

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

  Json parse_document() {
    Json v = parse_value();
    skip_space();
    if (pos_ != s_.size()) fail("trailing characters after the header object");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where_ + ": bad safetensors header at byte " + std::to_string(pos_) + ": " + what);
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
  std::string where_;
  size_t pos_ = 0;
  int depth_ = 0;
  int64_t values_ = 0;
};

uint64_t as_offset(const Json& v, const std::string& where) {
  GQ_CHECK(v.kind == Json::Kind::kNumber && v.number >= 0 && v.number < kMaxJsonInteger &&
               v.number == std::floor(v.number),
           where, ": expected a non-negative integer below 2^53");
  return uint64_t(v.number);
}

// Bytes per element of a safetensors dtype name, 0 for an unknown one.
size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

std::string escape_json(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", unsigned(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;  // other dims may be huge
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t safetensors_dtype_size(const std::string& dtype) {
  const size_t bytes = dtype_bytes(dtype);
  GQ_CHECK(bytes != 0, "safetensors: unknown dtype '", dtype, "'");
  return bytes;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  GQ_CHECK(in.good(), path, ": cannot open");
  const uint64_t file_size = uint64_t(in.tellg());
  GQ_CHECK(file_size >= 8, path, ": too short for a safetensors file (", file_size, " bytes)");
  in.seekg(0);
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  GQ_CHECK(header_len <= kMaxHeaderBytes && 8 + header_len <= file_size, path, ": header length ",
           header_len, " does not fit the file (", file_size, " bytes)");
  std::string header(size_t(header_len), '\0');
  in.read(header.data(), std::streamsize(header_len));
  GQ_CHECK(in.good(), path, ": cannot read the header");
  data_offset_ = 8 + header_len;
  const uint64_t data_bytes = file_size - data_offset_;

  const Json root = JsonParser(header, path).parse_document();
  GQ_CHECK(root.kind == Json::Kind::kObject, path, ": the header is not a JSON object");
  for (const auto& [name, value] : root.members) {
    if (name == "__metadata__") {
      GQ_CHECK(value.kind == Json::Kind::kObject, path, ": __metadata__ is not an object");
      for (const auto& [key, v] : value.members) {
        GQ_CHECK(v.kind == Json::Kind::kString, path, ": __metadata__.", key, " is not a string");
        metadata_[key] = v.str;
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    GQ_CHECK(value.kind == Json::Kind::kObject, where, ": entry is not an object");
    SafetensorsEntry e;
    e.name = name;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    for (const auto& [key, v] : value.members) {
      if (key == "dtype") {
        GQ_CHECK(v.kind == Json::Kind::kString, where, ": dtype is not a string");
        e.dtype = v.str;
        has_dtype = true;
      } else if (key == "shape") {
        GQ_CHECK(v.kind == Json::Kind::kArray, where, ": shape is not an array");
        for (const Json& d : v.items) e.shape.push_back(int64_t(as_offset(d, where + " shape")));
        has_shape = true;
      } else if (key == "data_offsets") {
        GQ_CHECK(v.kind == Json::Kind::kArray && v.items.size() == 2, where,
                 ": data_offsets is not a pair");
        e.begin = as_offset(v.items[0], where + " data_offsets");
        e.end = as_offset(v.items[1], where + " data_offsets");
        has_offsets = true;
      }
    }
    GQ_CHECK(has_dtype && has_shape && has_offsets, where, ": needs dtype, shape and data_offsets");
    GQ_CHECK(dtype_bytes(e.dtype) != 0, where, ": unknown dtype '", e.dtype, "'");
    GQ_CHECK(e.begin <= e.end && e.end <= data_bytes, where, ": data_offsets [", e.begin, ", ", e.end,
             ") outside the data section (", data_bytes, " bytes)");
    // dtype x shape in bytes, held at UINT64_MAX (no tensor's size) where it would overflow.
    uint64_t expected = dtype_bytes(e.dtype);
    for (int64_t d : e.shape)
      expected = d != 0 && expected > UINT64_MAX / uint64_t(d) ? UINT64_MAX : expected * uint64_t(d);
    GQ_CHECK(e.end - e.begin == expected, where, ": holds ", e.end - e.begin, " bytes but ", e.dtype,
             " with its shape needs ", expected == UINT64_MAX ? "2^64 or more" : std::to_string(expected));
    entries_.push_back(std::move(e));
  }

  // The format's layout: the tensors tile the data section, so none shares bytes with another.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    const uint64_t next = prev ? prev->end : 0;
    GQ_CHECK(e->begin >= next, path, ": tensor '", e->name, "': data_offsets [", e->begin, ", ", e->end,
             ") overlap tensor '", prev->name, "' [", prev->begin, ", ", prev->end, ")");
    GQ_CHECK(e->begin == next, path, ": tensor '", e->name, "': data_offsets [", e->begin, ", ", e->end,
             ") leave a gap after byte ", next, " of the data section");
    prev = e;
  }
  const uint64_t used = prev ? prev->end : 0;
  GQ_CHECK(used == data_bytes, path, ": ", data_bytes - used, " bytes after the last tensor in the data section");
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void SafetensorsFile::read(const SafetensorsEntry& entry, void* dst) const {
  std::ifstream in(path_, std::ios::binary);
  GQ_CHECK(in.good(), path_, ": cannot open");
  in.seekg(std::streamoff(data_offset_ + entry.begin));
  in.read(static_cast<char*>(dst), std::streamsize(entry.end - entry.begin));
  GQ_CHECK(in.good(), path_, ": cannot read tensor '", entry.name, "'");
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::ostringstream header;
  header << '{';
  bool first = true;
  if (!metadata.empty()) {
    header << "\"__metadata__\":{";
    bool first_key = true;
    for (const auto& [k, v] : metadata) {
      header << (first_key ? "" : ",") << '"' << escape_json(k) << "\":\"" << escape_json(v) << '"';
      first_key = false;
    }
    header << '}';
    first = false;
  }
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const SafetensorsTensor& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    const uint64_t bytes = uint64_t(numel) * safetensors_dtype_size(t.dtype);
    sizes.push_back(bytes);
    header << (first ? "" : ",") << '"' << escape_json(t.name) << "\":{\"dtype\":\"" << t.dtype
           << "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) header << (i ? "," : "") << t.shape[i];
    header << "],\"data_offsets\":[" << offset << ',' << offset + bytes << "]}";
    offset += bytes;
    first = false;
  }
  header << '}';
  std::string text = header.str();
  while ((8 + text.size()) % kDataAlign != 0) text += ' ';

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  GQ_CHECK(out.good(), path, ": cannot create");
  unsigned char len_bytes[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i, len >>= 8) len_bytes[i] = static_cast<unsigned char>(len & 0xFF);
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (size_t i = 0; i < tensors.size(); ++i)
    out.write(static_cast<const char*>(tensors[i].data), std::streamsize(sizes[i]));
  GQ_CHECK(out.good(), path, ": write failed");
}

}  // namespace gqattn::engine
