import type { Hex } from "viem";
import { BaseError } from "../../domain/base-error.js";
import { modelStatuses, offerStatuses, type JsonValue } from "../../domain/catalog.js";
import { normalizeHex } from "../../domain/hex.js";
import type { ModelState, OfferState } from "../pg/catalog.js";

/**
 * Chain values -> catalog rows, or a quarantine.
 *
 * Anyone may create a model or an offer on the market and write any bytes into its strings, and
 * any `uint32` into `maxConcurrency`. A value the database cannot hold (a NUL in a text column or
 * a JSON string, an unpaired surrogate in `jsonb`, an integer above int4) used to fail the
 * indexer's transaction for the whole range, so one offer operator could stop indexing for the
 * market. Every value is checked here first: it either maps to a row the database accepts or
 * the entity is QUARANTINED (stored ineligible, with neutral values and a reason code that names
 * the field and the problem, never the value).
 */

/** The longest text field (UTF-8 bytes) the catalog stores: region, hardware, repository... */
export const maxTextBytes = 1024;
/** The longest capabilities JSON text (UTF-8 bytes). */
export const maxCapabilitiesBytes = 64 * 1024;
/** The deepest nesting of capabilities JSON (objects and arrays). */
export const maxCapabilitiesDepth = 32;
/** `offers.max_concurrency` is int4. */
export const maxConcurrencyLimit = 2 ** 31 - 1;

/** A model as the market's `getModel` returns it, strings as their raw bytes. */
export interface RawModel {
  readonly creator: Hex;
  readonly creditToken: Hex;
  readonly repository: Uint8Array;
  readonly revision: Uint8Array;
  readonly task: Uint8Array;
  readonly poolId: Hex;
  readonly positionTokenId: bigint;
  readonly status: number;
}

/** An offer as the market's `getOffer` returns it, strings as their raw bytes. */
export interface RawOffer {
  readonly modelId: Hex;
  readonly owner: Hex;
  readonly operator: Hex;
  readonly payout: Hex;
  readonly status: number;
  readonly tariff: {
    readonly version: bigint | number;
    readonly inputPricePerMTok: bigint;
    readonly outputPricePerMTok: bigint;
    readonly wakeFee: bigint;
  };
  readonly metadata: {
    readonly region: Uint8Array;
    readonly hardware: Uint8Array;
    readonly maxConcurrency: bigint | number;
    readonly capabilities: Uint8Array;
  };
}

/** Why a value cannot be stored; thrown inside this module only. */
class Rejected extends BaseError {
  override readonly name = "Rejected";
  constructor(readonly reason: string) {
    super(reason);
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Decodes a text field: valid UTF-8, no NUL, at most `max` bytes. */
function text(field: string, bytes: Uint8Array, max = maxTextBytes): string {
  if (bytes.length > max) throw new Rejected(`${field}_too_long`);
  let value: string;
  try {
    value = utf8.decode(bytes);
  } catch {
    throw new Rejected(`${field}_invalid_utf8`);
  }
  if (value.includes("\u0000")) throw new Rejected(`${field}_has_nul`);
  return value;
}

/** Whether a JS string is well-formed UTF-16 (no unpaired surrogate; `jsonb` refuses them). */
function wellFormed(value: string): boolean {
  for (let i = 0; i < value.length; i++) {
    const unit = value.charCodeAt(i);
    if (unit >= 0xd800 && unit <= 0xdbff) {
      const next = value.charCodeAt(i + 1);
      if (!(next >= 0xdc00 && next <= 0xdfff)) return false;
      i++;
    } else if (unit >= 0xdc00 && unit <= 0xdfff) {
      return false;
    }
  }
  return true;
}

/** Checks every string (keys too) and the depth of parsed JSON. */
function checkJson(value: unknown, depth: number): void {
  if (typeof value === "string") {
    if (value.includes("\u0000")) throw new Rejected("capabilities_has_nul");
    if (!wellFormed(value)) throw new Rejected("capabilities_invalid_unicode");
    return;
  }
  if (typeof value !== "object" || value === null) return;
  if (depth >= maxCapabilitiesDepth) throw new Rejected("capabilities_too_deep");
  if (Array.isArray(value)) {
    for (const item of value) checkJson(item, depth + 1);
    return;
  }
  for (const [key, item] of Object.entries(value)) {
    checkJson(key, depth);
    checkJson(item, depth + 1);
  }
}

/**
 * The capabilities an offer publishes (JSON object text). Text that is not a JSON object is an
 * offer advertising none (`{}`), as before; text the catalog cannot hold is rejected.
 */
function capabilities(bytes: Uint8Array): { [key: string]: JsonValue } {
  const source = text("capabilities", bytes, maxCapabilitiesBytes);
  let value: unknown;
  try {
    value = JSON.parse(source);
  } catch {
    return {};
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) return {};
  checkJson(value, 1);
  // Stored re-serialised: `1e20` is 4 bytes in, 21 out.
  if (Buffer.byteLength(JSON.stringify(value)) > maxCapabilitiesBytes) {
    throw new Rejected("capabilities_too_long");
  }
  return value as { [key: string]: JsonValue };
}

function status<S extends string>(field: string, statuses: readonly S[], index: number): S {
  const value = statuses[index];
  if (value === undefined) throw new Rejected(`${field}_unknown`);
  return value;
}

function concurrency(value: bigint | number): number {
  const n = BigInt(value);
  if (n < 0n || n > BigInt(maxConcurrencyLimit)) throw new Rejected("max_concurrency_out_of_range");
  return Number(n);
}

/** The first problem `check` throws, as a reason; undefined when it passes. */
function reasonOf(check: () => void): string | undefined {
  try {
    check();
    return undefined;
  } catch (err) {
    if (err instanceof Rejected) return err.reason;
    throw err;
  }
}

/**
 * The model row for a chain model. A quarantined model keeps its typed fields (addresses,
 * ids, status as far as known) and empty strings, with `quarantineReason` set.
 */
export function modelFromChain(modelId: Hex, raw: RawModel): ModelState {
  const base = {
    modelId: normalizeHex(modelId),
    creator: normalizeHex(raw.creator),
    creditToken: normalizeHex(raw.creditToken),
    poolId: normalizeHex(raw.poolId),
    positionTokenId: raw.positionTokenId,
  };
  let row: ModelState | undefined;
  const reason = reasonOf(() => {
    row = {
      ...base,
      repository: text("repository", raw.repository),
      revision: text("revision", raw.revision),
      task: text("task", raw.task),
      status: status("status", modelStatuses, raw.status),
    };
  });
  if (row !== undefined) return row;
  return {
    ...base,
    repository: "",
    revision: "",
    task: "",
    status: modelStatuses[raw.status] ?? "retired",
    quarantineReason: reason,
  };
}

/**
 * The offer row for a chain offer. A quarantined offer keeps its typed fields (model, owner,
 * operator, payout, tariff, status as far as known) with neutral metadata (empty strings, no
 * capabilities, `max_concurrency` 0: nothing can be admitted on it even by mistake) and
 * `quarantineReason` set.
 */
export function offerFromChain(offerId: Hex, raw: RawOffer): OfferState {
  const base = {
    offerId: normalizeHex(offerId),
    modelId: normalizeHex(raw.modelId),
    owner: normalizeHex(raw.owner),
    operator: normalizeHex(raw.operator),
    payout: normalizeHex(raw.payout),
    tariff: {
      version: BigInt(raw.tariff.version),
      inputPricePerMTok: raw.tariff.inputPricePerMTok,
      outputPricePerMTok: raw.tariff.outputPricePerMTok,
      wakeFee: raw.tariff.wakeFee,
    },
  };
  let row: OfferState | undefined;
  const reason = reasonOf(() => {
    row = {
      ...base,
      status: status("status", offerStatuses, raw.status),
      region: text("region", raw.metadata.region),
      hardware: text("hardware", raw.metadata.hardware),
      maxConcurrency: concurrency(raw.metadata.maxConcurrency),
      capabilities: capabilities(raw.metadata.capabilities),
    };
  });
  if (row !== undefined) return row;
  return quarantinedOffer(
    { ...base, status: offerStatuses[raw.status] ?? "retired" },
    reason ?? "unknown",
  );
}

/** An offer's neutral quarantine row: its typed fields kept, its metadata emptied. */
export function quarantinedOffer(
  offer: Pick<
    OfferState,
    "offerId" | "modelId" | "owner" | "operator" | "payout" | "status" | "tariff"
  >,
  reason: string,
): OfferState {
  return {
    offerId: offer.offerId,
    modelId: offer.modelId,
    owner: offer.owner,
    operator: offer.operator,
    payout: offer.payout,
    status: offer.status,
    tariff: offer.tariff,
    region: "",
    hardware: "",
    maxConcurrency: 0,
    capabilities: {},
    quarantineReason: reason,
  };
}

/** A model's neutral quarantine row: its typed fields kept, its strings emptied. */
export function quarantinedModel(model: ModelState, reason: string): ModelState {
  return { ...model, repository: "", revision: "", task: "", quarantineReason: reason };
}
