// The safetensors reader (its header parsed by json.h) and writer. Layer: engine (host-only).
#include "safetensors.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "gqattn/error.h"
#include "json.h"

namespace gqattn::engine {

namespace {

// A header larger than this is a corrupt file, not a checkpoint.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;
// The writer pads the header with spaces so the data section starts at a multiple of this.
constexpr size_t kDataAlign = 8;

uint64_t as_offset(const Json& v, const std::string& where) {
  const std::optional<int64_t> n = v.integer();
  GQ_CHECK(n && *n >= 0, where, ": expected a non-negative integer below 2^53");
  return uint64_t(*n);
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

  const Json root = parse_json(header, path + ": bad safetensors header");
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
