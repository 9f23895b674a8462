import type pg from "pg";
import {
  hexToBytes,
  type Abi,
  type AbiParameter,
  type Address,
  type Hex,
  type PublicClient,
} from "viem";
import type { Logger } from "pino";
import { normalizeHex } from "../../domain/hex.js";
import {
  advanceCursor,
  existingModels,
  knownCreditTokens,
  readCursor,
  recordCreditToken,
  unrecordedCreditTokens,
  upsertModel,
  upsertOffer,
  type ModelState,
  type OfferState,
  type Queryable,
  type UpsertResult,
} from "../pg/catalog.js";
import { recordOpenedPermits, type OpenedPermit } from "../pg/opened-permits.js";
import { recordPermitClosing } from "../pg/settlement.js";
import { marketAbi } from "../../../gen/contracts/artifacts.js";
import {
  modelFromChain,
  offerFromChain,
  quarantinedModel,
  quarantinedOffer,
  type RawModel,
  type RawOffer,
} from "./catalog-values.js";
import { readTokenUnits } from "./token-units.js";
import type { TokenUnits } from "../../domain/token-units.js";

export interface IndexerDeps {
  readonly client: PublicClient;
  readonly market: Address;
  readonly pool: pg.Pool;
  /** Blocks the indexer stays behind the head. */
  readonly confirmations: number;
  /** First block to read when there is no cursor yet. */
  readonly startBlock: bigint;
  readonly pollIntervalMs: number;
  readonly logger: Logger;
  /** Blocks per getLogs call. */
  readonly batchSize?: bigint;
  /**
   * Told of the head block each pass reads (its number and timestamp, Unix seconds), before
   * anything else of the pass: the latest block time the gateway has seen (permit expiry is
   * judged by it, `PermitClock`) at no extra RPC.
   */
  readonly onHead?: (head: { readonly number: bigint; readonly timestamp: number }) => void;
  /** Told of every permit an event touched (opened, closing, closed, charged), so caches drop it. */
  readonly onPermitEvent?: (permitId: Hex) => void;
  /** Told after a pass that changed models or offers. */
  readonly onCatalogChange?: () => void;
  /**
   * Told of the models a pass wrote (after its commit, before `onCatalogChange`; quarantined ones
   * left out), so their tokenizers are loaded before their offers route (issue 35, item 5).
   */
  readonly onModelsIndexed?: (models: readonly ModelState[]) => void;
  /**
   * Told after a pass that recorded permits entering their close grace period
   * (`PermitCloseRequested`, stored in `permit_closings` with the cursor), so their charges
   * can be settled before `closableAt`.
   */
  readonly onPermitClosing?: (permitIds: readonly Hex[]) => void;
}

export interface SyncResult {
  readonly fromBlock: bigint;
  readonly toBlock: bigint;
  readonly models: number;
  readonly offers: number;
  /** More confirmed blocks are waiting beyond `toBlock`. */
  readonly behind: boolean;
}

export interface Indexer {
  /** Indexes the next range of confirmed blocks; undefined when there is none. */
  syncOnce(): Promise<SyncResult | undefined>;
  /** Polls until {@link stop}. */
  start(): void;
  stop(): Promise<void>;
}

const cursorName = "market";

/** `string` -> `bytes` (same ABI encoding), so strings arrive as the bytes the chain holds. */
function stringsAsBytes(param: AbiParameter): AbiParameter {
  if (param.type === "string") return { ...param, type: "bytes" };
  if ("components" in param && param.components !== undefined) {
    return { ...param, components: param.components.map(stringsAsBytes) } as AbiParameter;
  }
  return param;
}

/**
 * `getModel` and `getOffer` with their strings read as bytes: viem decodes a `string` lossily
 * (invalid UTF-8 becomes U+FFFD), and the indexer must see what the chain holds to decide.
 */
const rawReadAbi = marketAbi
  .filter((item) => item.type === "function" && ["getModel", "getOffer"].includes(item.name))
  .map((item) => ({
    ...item,
    outputs: (item as { outputs: readonly AbiParameter[] }).outputs.map(stringsAsBytes),
  })) as Abi;

type RawModelResult = Omit<RawModel, "repository" | "revision" | "task"> & {
  repository: Hex;
  revision: Hex;
  task: Hex;
};
type RawOfferResult = Omit<RawOffer, "metadata"> & {
  metadata: { region: Hex; hardware: Hex; maxConcurrency: number; capabilities: Hex };
};

// Values the catalog cannot hold make a quarantined row here (catalog-values.ts), before
// anything is written.
async function readModel(
  client: PublicClient,
  market: Address,
  modelId: Hex,
  blockNumber: bigint,
): Promise<ModelState> {
  const m = (await client.readContract({
    address: market,
    abi: rawReadAbi,
    functionName: "getModel",
    args: [modelId],
    blockNumber,
  })) as RawModelResult;
  return modelFromChain(modelId, {
    ...m,
    repository: hexToBytes(m.repository),
    revision: hexToBytes(m.revision),
    task: hexToBytes(m.task),
  });
}

async function readOffer(
  client: PublicClient,
  market: Address,
  offerId: Hex,
  blockNumber: bigint,
): Promise<OfferState> {
  const o = (await client.readContract({
    address: market,
    abi: rawReadAbi,
    functionName: "getOffer",
    args: [offerId],
    blockNumber,
  })) as RawOfferResult;
  return offerFromChain(offerId, {
    ...o,
    metadata: {
      region: hexToBytes(o.metadata.region),
      hardware: hexToBytes(o.metadata.hardware),
      maxConcurrency: o.metadata.maxConcurrency,
      capabilities: hexToBytes(o.metadata.capabilities),
    },
  });
}

/** SQLSTATE classes a row's values cause: data exception, integrity violation, program limit. */
const rowErrorClasses = ["22", "23", "54"];

function sqlState(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/**
 * Runs one row's write inside a savepoint. A failure the row's values caused (see
 * {@link rowErrorClasses}) is rolled back to the savepoint and reported as its SQLSTATE, so the
 * range's transaction goes on; any other failure (connection, timeout) is thrown, and the whole
 * range is retried.
 */
async function inSavepoint<T>(
  db: Queryable,
  write: () => Promise<T>,
): Promise<{ ok: true; value: T } | { ok: false; code: string }> {
  await db.query("SAVEPOINT indexer_row");
  try {
    const value = await write();
    await db.query("RELEASE SAVEPOINT indexer_row");
    return { ok: true, value };
  } catch (err) {
    const code = sqlState(err);
    if (code === undefined || !rowErrorClasses.includes(code.slice(0, 2))) throw err;
    await db.query("ROLLBACK TO SAVEPOINT indexer_row");
    await db.query("RELEASE SAVEPOINT indexer_row");
    return { ok: false, code };
  }
}

/** A quarantine that started or was lifted by a write, to be logged once the range commits. */
export interface QuarantineChange {
  readonly kind: "model" | "offer";
  readonly id: Hex;
  /** The new reason; undefined when the quarantine was lifted. */
  readonly reason: string | undefined;
}

/**
 * Writes the models and offers of one range (inside the caller's transaction), each in its own
 * savepoint. Values were checked before ({@link modelFromChain}, {@link offerFromChain}); a row
 * the database still refuses is written again as a quarantine (`db_rejected_<SQLSTATE>`), so no
 * single model or offer can fail the range. Returns the quarantines that started or ended.
 */
export async function writeCatalogRows(
  db: Queryable,
  rows: { models: readonly ModelState[]; offers: readonly OfferState[] },
  block: bigint,
): Promise<QuarantineChange[]> {
  const changes: QuarantineChange[] = [];
  const note = (
    kind: QuarantineChange["kind"],
    id: Hex,
    reason: string | undefined,
    result: UpsertResult,
  ) => {
    if (result.written && (result.previousQuarantine ?? undefined) !== reason) {
      changes.push({ kind, id, reason });
    }
  };
  // In id order: each write locks its entity until commit, and concurrent indexers taking the
  // same locks in the same order cannot deadlock.
  const byId =
    <T>(key: (row: T) => string) =>
    (a: T, b: T) =>
      key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0;
  for (const model of [...rows.models].sort(byId((m) => m.modelId))) {
    let written = await inSavepoint(db, () => upsertModel(db, model, block));
    let stored = model;
    if (!written.ok) {
      stored = quarantinedModel(model, `db_rejected_${written.code}`);
      written = await inSavepoint(db, () => upsertModel(db, stored, block));
      // Neutral values refused too: not the row's fault; retry the range.
      if (!written.ok) throw new Error(`cannot store model ${model.modelId} (${written.code})`);
    }
    note("model", model.modelId, stored.quarantineReason, written.value);
  }
  for (const offer of [...rows.offers].sort(byId((o) => o.offerId))) {
    let written = await inSavepoint(db, () => upsertOffer(db, offer, block));
    let stored = offer;
    if (!written.ok) {
      stored = quarantinedOffer(offer, `db_rejected_${written.code}`);
      written = await inSavepoint(db, () => upsertOffer(db, stored, block));
      if (!written.ok) throw new Error(`cannot store offer ${offer.offerId} (${written.code})`);
    }
    note("offer", offer.offerId, stored.quarantineReason, written.value);
  }
  return changes;
}

/**
 * The decimals and symbol of the credit tokens `models` name that were never read (read once per
 * token: a recorded token is not asked again, by this process or any other), at `block`; with a
 * few tokens of models indexed before they were read (migration 040), so an existing catalog
 * learns its units over the next passes.
 */
async function readNewCreditTokens(
  client: PublicClient,
  db: Queryable,
  models: readonly ModelState[],
  block: bigint,
): Promise<{ token: Hex; units: TokenUnits }[]> {
  const backlog = await unrecordedCreditTokens(db, 16);
  const tokens = [...new Set([...models.map((m) => m.creditToken), ...backlog])];
  if (tokens.length === 0) return [];
  const known = await knownCreditTokens(db, tokens);
  const unread = tokens.filter((token) => !known.has(token));
  return Promise.all(
    unread.map(async (token) => ({ token, units: await readTokenUnits(client, token, block) })),
  );
}

/**
 * Indexes models and offers from the market's events. Each range of blocks
 * is read, the models and offers its events touch are re-read from contract
 * state at the range's last block, and rows and cursor are written in one
 * transaction: a crash before commit re-reads the same range, and re-reading
 * is idempotent, so a restart resumes from the cursor and never duplicates.
 */
export function createIndexer(deps: IndexerDeps): Indexer {
  const { client, market, pool, logger } = deps;
  const batchSize = deps.batchSize ?? 2000n;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let stopped = true;

  const syncOnce = async (): Promise<SyncResult | undefined> => {
    // The head block rather than only its number: one call either way, and its time is the
    // chain's clock for permit expiry.
    const latest = await client.getBlock({ blockTag: "latest" });
    const head = latest.number;
    deps.onHead?.({ number: head, timestamp: Number(latest.timestamp) });
    const safe = head - BigInt(deps.confirmations);
    const cursor = (await readCursor(pool, cursorName)) ?? deps.startBlock - 1n;
    if (safe <= cursor) return undefined;
    const fromBlock = cursor + 1n;
    const toBlock = safe < fromBlock + batchSize - 1n ? safe : fromBlock + batchSize - 1n;

    const events = await client.getContractEvents({
      address: market,
      abi: marketAbi,
      fromBlock,
      toBlock,
    });
    const modelIds = new Set<Hex>();
    const offerIds = new Set<Hex>();
    const closings: { permitId: Hex; closableAt: number; blockNumber: bigint }[] = [];
    const opened: OpenedPermit[] = [];
    for (const event of events) {
      if (event.eventName === "PermitOpened") {
        const { permitId, payer, modelId } = event.args as {
          permitId: Hex;
          payer: Hex;
          modelId: Hex;
        };
        opened.push({ permitId, payer, modelId, blockNumber: event.blockNumber });
      }
      if (event.eventName === "PermitCloseRequested") {
        const { permitId, closableAt } = event.args as { permitId: Hex; closableAt: bigint };
        closings.push({
          permitId: normalizeHex(permitId),
          closableAt: Number(closableAt),
          blockNumber: event.blockNumber,
        });
      }
      const args = event.args as { modelId?: Hex; offerId?: Hex; permitId?: Hex };
      if (args.permitId !== undefined) deps.onPermitEvent?.(normalizeHex(args.permitId));
      if (event.eventName.startsWith("Model") && args.modelId !== undefined)
        modelIds.add(normalizeHex(args.modelId));
      if (event.eventName.startsWith("Offer") && args.offerId !== undefined)
        offerIds.add(normalizeHex(args.offerId));
    }
    const offers = await Promise.all(
      [...offerIds].map((id) => readOffer(client, market, id, toBlock)),
    );
    // An offer's model may predate START_BLOCK: read it too, or the offer's row could not be
    // stored (its model_id references models).
    const known = await existingModels(pool, [...new Set(offers.map((o) => o.modelId))]);
    for (const offer of offers) if (!known.has(offer.modelId)) modelIds.add(offer.modelId);
    const models = await Promise.all(
      [...modelIds].map((id) => readModel(client, market, id, toBlock)),
    );
    const tokens = await readNewCreditTokens(client, pool, models, toBlock);

    let changes: QuarantineChange[];
    const db = await pool.connect();
    try {
      await db.query("BEGIN");
      for (const { token, units } of tokens) await recordCreditToken(db, token, units, toBlock);
      changes = await writeCatalogRows(db, { models, offers }, toBlock);
      for (const c of closings)
        await recordPermitClosing(db, c.permitId, c.closableAt, c.blockNumber);
      await recordOpenedPermits(db, opened);
      await advanceCursor(db, cursorName, toBlock);
      await db.query("COMMIT");
    } catch (error) {
      await db.query("ROLLBACK").catch(() => undefined);
      throw error;
    } finally {
      db.release();
    }
    // Once per change, after the commit; the reason names the field and the problem, never the
    // value (which is the operator's to fix, and may be anything).
    for (const change of changes) {
      const key = change.kind === "model" ? "modelId" : "offerId";
      if (change.reason === undefined) {
        logger.info({ [key]: change.id }, `${change.kind} quarantine lifted`);
      } else {
        logger.warn(
          { [key]: change.id, reason: change.reason },
          `${change.kind} quarantined: the chain states a value the catalog cannot hold`,
        );
      }
    }
    const result = {
      fromBlock,
      toBlock,
      models: models.length,
      offers: offers.length,
      behind: toBlock < safe,
    };
    if (closings.length > 0) deps.onPermitClosing?.(closings.map((c) => c.permitId));
    if (models.length + offers.length > 0) {
      logger.info(result, "indexed market events");
      const indexed = models.filter((m) => m.quarantineReason === undefined);
      if (indexed.length > 0) deps.onModelsIndexed?.(indexed);
      deps.onCatalogChange?.();
    }
    return result;
  };

  const loop = async (): Promise<void> => {
    let delay = deps.pollIntervalMs;
    try {
      const result = await syncOnce();
      if (result?.behind) delay = 0;
    } catch (error) {
      logger.warn({ err: error }, "indexer pass failed; retrying");
    }
    if (!stopped) timer = setTimeout(() => (running = loop()), delay);
  };

  return {
    syncOnce,
    start() {
      if (!stopped) return;
      stopped = false;
      running = loop();
    },
    async stop() {
      stopped = true;
      if (timer !== undefined) clearTimeout(timer);
      await running;
    },
  };
}
