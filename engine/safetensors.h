// A small safetensors reader and writer: an 8-byte little-endian header length, a JSON header
// mapping tensor names to {dtype, shape, data_offsets}, then the raw bytes. Reading parses the
// header and reads a tensor's bytes on request (large checkpoints are never read whole).
// Layer: engine (host-only).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace gqattn::engine {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;             // "BF16", "F16", "F32", "I32", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;   // byte offsets into the data section
  int64_t numel() const;
};

// Bytes per element of a safetensors dtype name; throws gqattn::Error for an unknown one.
size_t safetensors_dtype_size(const std::string& dtype);

class SafetensorsFile {
 public:
  // Reads and checks the header: offsets inside the file, sizes matching dtype x shape, the
  // tensors tiling the data section (no overlaps, no gaps), no duplicate names.
  // Throws gqattn::Error naming the file and the problem.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsEntry* find(const std::string& name) const;
  // Copies the entry's raw bytes (end - begin of them) to `dst`.
  void read(const SafetensorsEntry& entry, void* dst) const;

 private:
  std::string path_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: its bytes must hold numel x dtype size bytes.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes tensors (in the given order) and string metadata. Throws gqattn::Error on failure.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace gqattn::engine
