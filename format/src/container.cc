#include "container.h"

#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t on the stack.
#include <xxhash.h>

namespace torchrr::format {

uint64_t ChunkChecksum(const uint8_t* header, const uint8_t* payload, size_t payload_size) {
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  XXH64_update(&state, header, kChunkHeaderChecksummedSize);
  XXH64_update(&state, payload, payload_size);
  return XXH64_digest(&state);
}

}  // namespace torchrr::format
