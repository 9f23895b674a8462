import fc from "fast-check";
import type { Hex } from "viem";
import type { RawModel, RawOffer } from "../../src/adapters/chain/catalog-values.js";

/**
 * Arbitrary values the market's `getModel` / `getOffer` can return: anything the ABI types
 * allow (strings are any bytes), biased towards what the catalog cannot hold (NUL, invalid
 * UTF-8, lengths around the limits, `jsonb` poison such as `\u0000` escapes and unpaired
 * surrogates, deep nesting, `uint32` above int4).
 */

const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

const hexOf = (bytes: number) =>
  fc
    .uint8Array({ minLength: bytes, maxLength: bytes })
    .map((b) => `0x${Buffer.from(b).toString("hex")}` as Hex);

export const addressArb = hexOf(20);
export const hex32Arb = hexOf(32);

const uint = (bits: number) => fc.bigInt({ min: 0n, max: 2n ** BigInt(bits) - 1n });

/** Bytes of a string field. */
export const textBytesArb: fc.Arbitrary<Uint8Array> = fc.oneof(
  fc.string({ maxLength: 40 }).map(utf8),
  fc.string({ unit: "grapheme", maxLength: 20 }).map(utf8),
  fc.uint8Array({ maxLength: 40 }),
  fc
    .tuple(fc.string({ maxLength: 10 }), fc.string({ maxLength: 10 }))
    .map(([a, b]) => utf8(`${a}\u0000${b}`)),
  fc.integer({ min: 1000, max: 1100 }).map((n) => utf8("x".repeat(n))),
  fc.integer({ min: 500, max: 520 }).map((n) => utf8("é".repeat(n))),
);

const escapes = ["\\u0000", "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\u0001", "\\\\", "x", ""];

/** Bytes of the capabilities JSON text. */
export const capabilitiesBytesArb: fc.Arbitrary<Uint8Array> = fc.oneof(
  fc.jsonValue().map((v) => utf8(JSON.stringify(v))),
  fc
    .dictionary(fc.string({ unit: "binary", maxLength: 6 }), fc.jsonValue({ maxDepth: 3 }), {
      maxKeys: 4,
    })
    .map((v) => utf8(JSON.stringify(v))),
  fc
    .dictionary(fc.string({ unit: "binary", maxLength: 6 }), fc.string({ unit: "binary" }), {
      maxKeys: 3,
    })
    .map((v) => utf8(JSON.stringify(v))),
  fc
    .tuple(fc.constantFrom(...escapes), fc.constantFrom(...escapes), fc.boolean())
    .map(([a, b, inKey]) => utf8(inKey ? `{"${a}":"${b}"}` : `{"k${a}":"v${b}"}`)),
  fc.integer({ min: 0, max: 40 }).map((n) => utf8(`{"a":${"[".repeat(n)}1${"]".repeat(n)}}`)),
  fc.integer({ min: 0, max: 40 }).map((n) => utf8(`${'{"a":'.repeat(n + 1)}1${"}".repeat(n + 1)}`)),
  fc.constantFrom(
    utf8('{"max_output_tokens":4096,"streaming":true}'),
    utf8('{"n":1e400,"m":-0,"big":123456789012345678901234567890}'),
    utf8("{\u0000}"),
    utf8(`{"pad":"${"x".repeat(64 * 1024)}"}`),
    utf8("[]"),
    utf8("null"),
    utf8(""),
  ),
  fc.uint8Array({ maxLength: 40 }),
);

/** A model as `getModel` returns it (strings as bytes). */
export const rawModelArb: fc.Arbitrary<RawModel> = fc.record({
  creator: addressArb,
  creditToken: addressArb,
  repository: textBytesArb,
  revision: textBytesArb,
  task: textBytesArb,
  poolId: hex32Arb,
  positionTokenId: uint(256),
  status: fc.integer({ min: 0, max: 255 }),
});

/** An offer as `getOffer` returns it (strings as bytes), for a given model. */
export const rawOfferArb = (modelId: fc.Arbitrary<Hex> = hex32Arb): fc.Arbitrary<RawOffer> =>
  fc.record({
    modelId,
    owner: addressArb,
    operator: addressArb,
    payout: addressArb,
    status: fc.oneof(fc.integer({ min: 0, max: 2 }), fc.integer({ min: 0, max: 255 })),
    tariff: fc.record({
      version: uint(64),
      inputPricePerMTok: uint(256),
      outputPricePerMTok: uint(256),
      wakeFee: uint(256),
    }),
    metadata: fc.record({
      region: textBytesArb,
      hardware: textBytesArb,
      maxConcurrency: fc.oneof(
        fc.integer({ min: 0, max: 64 }),
        fc.integer({ min: 2 ** 31 - 2, max: 2 ** 31 + 1 }),
        fc.integer({ min: 0, max: 2 ** 32 - 1 }),
      ),
      capabilities: capabilitiesBytesArb,
    }),
  });
