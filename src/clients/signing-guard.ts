import { isAddress, type Address } from "viem";
import { BaseError } from "../domain/base-error.js";
import type { TypedDataField } from "../domain/signatures.js";
import { noncePattern } from "../schema/signing.js";

/**
 * What every wallet tool of this project does before a key signs typed data a gateway asked for
 * (issue 28, item 1; docs/decisions/authority-and-signing.md, "Wallet tools sign only what their user asked for").
 *
 * The tool builds the typed data itself, with the domain's builders (one definition of each
 * typed data), from its own arguments and its own chain (chain id and market from the RPC or
 * its configuration). It takes from the gateway only what it cannot know: a challenge's nonce,
 * when the challenge was issued (checked against this machine's clock), and where the key id
 * cannot be derived from the key, the key id (shown before signing, or pinned by the user). It
 * then compares every field of the gateway's challenge with what it built (the primary type,
 * every struct and field list including `EIP712Domain`, the domain, the message) and on the
 * first difference signs nothing: {@link ChallengeMismatchError} names the field. What it signs
 * is always its own copy, never the gateway's.
 */

/** The chain a signature is for, from this machine's configuration (never from the gateway). */
export interface SigningChain {
  readonly chainId: number;
  readonly market: Address;
}

/** Typed data as a builder of src/domain makes it (wallet-ready: `EIP712Domain` listed). */
export interface BuiltTypedData {
  readonly types: { readonly EIP712Domain: readonly TypedDataField[] };
  readonly primaryType: string;
  readonly domain: object;
  readonly message: object;
}

/** The gateway's challenge differs from what the tool built: nothing was signed. */
export class ChallengeMismatchError extends BaseError {
  override readonly name = "ChallengeMismatchError";
  readonly reason = "challenge_mismatch";
  constructor(
    /** The differing field's path, e.g. `message.permitId`, `types.AuthorizeKey[2]`. */
    readonly field: string,
    expected: string,
    got: string,
    /** Who answered what differs, when it is not the challenge. */
    source = "the gateway's challenge",
  ) {
    super(`${source} differs at ${field}: expected ${expected}, got ${got}; nothing was signed`);
  }
}

/** The user did not confirm the summary shown before signing: nothing was signed. */
export class SigningDeclinedError extends BaseError {
  override readonly name = "SigningDeclinedError";
  readonly reason = "signing_declined";
  constructor() {
    super("not confirmed; nothing was signed");
  }
}

/**
 * What the tool is about to sign, in lines a person reads, shown before signing (after every
 * check passed). The values are the tool's own or checked by their shape: a gateway cannot put
 * control characters or text of its choosing into them.
 */
export interface SigningSummary {
  /** One line: what is signed, as whom, for which chain and market. */
  readonly title: string;
  readonly lines: readonly (readonly [label: string, value: string])[];
}

/**
 * Shows the summary and, where someone can answer, asks; resolves to sign, throws
 * {@link SigningDeclinedError} (or anything) not to. Absent: sign without showing (library
 * callers that built every value themselves: the sandbox, the benchmark, tests).
 */
export type ConfirmSigning = (summary: SigningSummary) => Promise<void> | void;

/** How far a challenge's `issuedAt` may be from this machine's clock. */
export const issuedAtToleranceSeconds = 300;

/** A value as an error message shows it: short, printable, never raw control characters. */
export function shown(value: unknown): string {
  if (value === undefined) return "nothing";
  if (typeof value === "string" && /^[\x21-\x7e]{1,100}$/.test(value)) return value;
  if (typeof value === "bigint") return value.toString();
  let text: string;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = String(value);
  }
  // JSON escapes control characters in strings; anything else non-printable is replaced.
  text = text.replace(/[^\x20-\x7e]/g, "?");
  return text.length > 120 ? `${text.slice(0, 117)}...` : text;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function fieldList(fields: unknown): string {
  if (!Array.isArray(fields)) return shown(fields);
  return fields
    .map((f) => (isRecord(f) ? `${shown(f.name)} ${shown(f.type)}` : shown(f)))
    .join(", ");
}

/** A JSON integer (a safe number or a decimal string) as a bigint; undefined when it is none. */
function integer(value: unknown): bigint | undefined {
  if (typeof value === "bigint") return value;
  if (typeof value === "number") return Number.isSafeInteger(value) ? BigInt(value) : undefined;
  if (typeof value === "string" && /^-?\d{1,78}$/.test(value)) return BigInt(value);
  return undefined;
}

/**
 * Whether `got` encodes as `expected` does under EIP-712 `type`: addresses and bytes compared
 * without regard to hex case (the encoding is the same), integers by value (a number or a
 * decimal string), strings and booleans exactly.
 */
function sameValue(type: string, expected: unknown, got: unknown): boolean {
  if (type === "address")
    return (
      typeof got === "string" &&
      isAddress(got, { strict: false }) &&
      got.toLowerCase() === String(expected).toLowerCase()
    );
  if (/^bytes\d+$/.test(type) || type === "bytes")
    return (
      typeof got === "string" &&
      /^0x[0-9a-fA-F]*$/.test(got) &&
      got.toLowerCase() === String(expected).toLowerCase()
    );
  if (/^u?int\d*$/.test(type)) {
    const g = integer(got);
    return g !== undefined && g === integer(expected);
  }
  if (type === "string" || type === "bool") return got === expected;
  return JSON.stringify(got) === JSON.stringify(expected);
}

/** Compares one struct's values (the domain or the message) field by field, then extra keys. */
function compareStruct(
  path: string,
  fields: readonly TypedDataField[],
  expected: Record<string, unknown>,
  got: unknown,
): void {
  if (!isRecord(got)) throw new ChallengeMismatchError(path, "an object", shown(got));
  for (const { name, type } of fields) {
    if (!sameValue(type, expected[name], got[name]))
      throw new ChallengeMismatchError(`${path}.${name}`, shown(expected[name]), shown(got[name]));
  }
  const known = new Set(fields.map((f) => f.name));
  for (const key of Object.keys(got))
    if (!known.has(key))
      throw new ChallengeMismatchError(`${path}.${key}`, "nothing", shown(got[key]));
}

/**
 * Compares the frame of the gateway's challenge with the tool's own typed data: no key beyond
 * `types`, `primaryType`, `domain` and `message`, the primary type, every struct's field list
 * (names, types, order; `EIP712Domain` included; no struct more or less), and the domain. The
 * frame holds nothing the gateway supplies, so it is checked before the tool takes anything from
 * the message. Throws {@link ChallengeMismatchError} at the first difference.
 */
export function checkFrame(expected: BuiltTypedData, got: unknown): void {
  if (!isRecord(got))
    throw new ChallengeMismatchError("(the whole challenge)", "EIP-712 typed data", shown(got));
  const top = new Set(["types", "primaryType", "domain", "message"]);
  for (const key of Object.keys(got))
    if (!top.has(key)) throw new ChallengeMismatchError(key, "nothing", shown(got[key]));
  if (got.primaryType !== expected.primaryType)
    throw new ChallengeMismatchError("primaryType", expected.primaryType, shown(got.primaryType));
  const expectedTypes = expected.types as unknown as Record<string, readonly TypedDataField[]>;
  const gotTypes = got.types;
  if (!isRecord(gotTypes)) throw new ChallengeMismatchError("types", "an object", shown(gotTypes));
  for (const [struct, fields] of Object.entries(expectedTypes)) {
    const list = gotTypes[struct];
    if (!Array.isArray(list))
      throw new ChallengeMismatchError(`types.${struct}`, fieldList(fields), shown(list));
    for (let i = 0; i < Math.max(fields.length, list.length); i++) {
      const want = fields[i];
      const have: unknown = list[i];
      const same =
        want !== undefined &&
        isRecord(have) &&
        Object.keys(have).length === 2 &&
        have.name === want.name &&
        have.type === want.type;
      if (!same)
        throw new ChallengeMismatchError(
          `types.${struct}[${i}]`,
          want === undefined ? "nothing" : `${want.name} ${want.type}`,
          have === undefined ? "nothing" : isRecord(have) ? fieldList([have]) : shown(have),
        );
    }
  }
  for (const struct of Object.keys(gotTypes))
    if (!(struct in expectedTypes))
      throw new ChallengeMismatchError(`types.${struct}`, "nothing", fieldList(gotTypes[struct]));
  compareStruct(
    "domain",
    expected.types.EIP712Domain,
    expected.domain as Record<string, unknown>,
    got.domain,
  );
  if (!isRecord(got.message))
    throw new ChallengeMismatchError("message", "an object", shown(got.message));
}

/**
 * The whole comparison: {@link checkFrame}, then every field of the message by its type, and no
 * field more. Throws {@link ChallengeMismatchError} at the first difference.
 */
export function checkTypedData(expected: BuiltTypedData, got: unknown): void {
  checkFrame(expected, got);
  const fields = (expected.types as unknown as Record<string, readonly TypedDataField[]>)[
    expected.primaryType
  ];
  if (fields === undefined) throw new Error(`typed data without its ${expected.primaryType} type`);
  compareStruct(
    "message",
    fields,
    expected.message as Record<string, unknown>,
    (got as { message: unknown }).message,
  );
}

/** The challenge's message, once {@link checkFrame} passed. */
function messageOf(challenge: unknown): Record<string, unknown> {
  return (challenge as { message: Record<string, unknown> }).message;
}

/** The challenge's single-use nonce: 1 to 128 printable ASCII characters. */
export function takeNonce(challenge: unknown): string {
  const nonce = messageOf(challenge).nonce;
  if (typeof nonce !== "string" || !noncePattern.test(nonce))
    throw new ChallengeMismatchError(
      "message.nonce",
      "a nonce (1 to 128 printable ASCII characters)",
      shown(nonce),
    );
  return nonce;
}

/**
 * When the gateway issued the challenge (Unix seconds): within
 * {@link issuedAtToleranceSeconds} of `now`, this machine's clock. A challenge issued long ago
 * or far ahead would make the signature outlive what the payer sees.
 */
export function takeIssuedAt(challenge: unknown, now: number): number {
  const issuedAt = messageOf(challenge).issuedAt;
  const at = integer(issuedAt);
  if (
    at === undefined ||
    at < BigInt(now - issuedAtToleranceSeconds) ||
    at > BigInt(now + issuedAtToleranceSeconds)
  )
    throw new ChallengeMismatchError(
      "message.issuedAt",
      `within ${issuedAtToleranceSeconds} seconds of this machine's clock (${now})`,
      shown(issuedAt),
    );
  return Number(at);
}

/** The shape of an API key's public id (`gateway keys create` prints it). */
export const apiKeyIdPattern = /^key_[0-9A-Za-z]{1,64}$/;

/**
 * The key id the challenge names. An API key's public id cannot be derived from the key, so it
 * comes from the gateway: pinned (`--key-id`, the id `gateway keys create` printed) it must be
 * that one; otherwise it is shown before signing.
 */
export function takeKeyId(challenge: unknown, pinned: string | undefined): string {
  const keyId = messageOf(challenge).keyId;
  if (typeof keyId !== "string" || !apiKeyIdPattern.test(keyId))
    throw new ChallengeMismatchError("message.keyId", "an API key id (key_...)", shown(keyId));
  if (pinned !== undefined && keyId !== pinned)
    throw new ChallengeMismatchError("message.keyId", pinned, keyId);
  return keyId;
}

/** Unix seconds as a person reads them: `1767225600 (2026-01-01T00:00:00.000Z, in 30 days)`. */
export function when(seconds: number, now: number): string {
  const iso = new Date(seconds * 1000).toISOString();
  const delta = seconds - now;
  if (Math.abs(delta) < 60) return `${seconds} (${iso}, now)`;
  const days = Math.abs(delta) / 86_400;
  const span =
    days >= 2
      ? `${Math.round(days)} days`
      : Math.abs(delta) >= 7200
        ? `${Math.round(Math.abs(delta) / 3600)} hours`
        : `${Math.round(Math.abs(delta) / 60)} minutes`;
  return `${seconds} (${iso}, ${delta >= 0 ? `in ${span}` : `${span} ago`})`;
}
