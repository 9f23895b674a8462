import { randomFillSync } from "node:crypto";

// Each call to the system's random source is a syscall, and ids are made on every request: they
// are cut from a pool filled 4 KiB at a time (Node's randomUUID does the same). The bytes are
// as random as randomBytes' and never handed out twice.
const pool = Buffer.alloc(4096);
let offset = pool.length;

/** `bytes` cryptographically random bytes as lower-case hex. */
export function randomHex(bytes: number): string {
  if (bytes > pool.length) throw new RangeError("randomHex: at most 4096 bytes");
  if (offset + bytes > pool.length) {
    randomFillSync(pool);
    offset = 0;
  }
  const hex = pool.toString("hex", offset, offset + bytes);
  offset += bytes;
  return hex;
}
