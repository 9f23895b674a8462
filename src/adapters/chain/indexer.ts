import type pg from "pg";
import type { Address, Hex, PublicClient } from "viem";
import type { Logger } from "pino";
import { modelStatuses, offerStatuses, type JsonValue } from "../../domain/catalog.js";
import { normalizeHex } from "../../domain/hex.js";
import {
  advanceCursor,
  readCursor,
  upsertModel,
  upsertOffer,
  type ModelState,
  type OfferState,
} from "../pg/catalog.js";
import { recordPermitClosing } from "../pg/settlement.js";
import { marketAbi } from "./artifacts.js";

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
  /** Told of every permit an event touched (opened, closing, closed, charged), so caches drop it. */
  readonly onPermitEvent?: (permitId: Hex) => void;
  /** Told after a pass that changed models or offers. */
  readonly onCatalogChange?: () => void;
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

/** Parses the capabilities JSON an offer publishes; anything but an object is ignored. */
export function parseCapabilities(text: string): { [key: string]: JsonValue } {
  try {
    const value: unknown = JSON.parse(text);
    if (typeof value === "object" && value !== null && !Array.isArray(value)) {
      return value as { [key: string]: JsonValue };
    }
  } catch {
    // fall through: an offer with unreadable capabilities advertises none
  }
  return {};
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

  const readModel = async (modelId: Hex, blockNumber: bigint): Promise<ModelState> => {
    const m = await client.readContract({
      address: market,
      abi: marketAbi,
      functionName: "getModel",
      args: [modelId],
      blockNumber,
    });
    return {
      modelId: normalizeHex(modelId),
      creator: normalizeHex(m.creator),
      creditToken: normalizeHex(m.creditToken),
      repository: m.repository,
      revision: m.revision,
      task: m.task,
      poolId: normalizeHex(m.poolId),
      positionTokenId: m.positionTokenId,
      status: modelStatuses[m.status] ?? "retired",
    };
  };

  const readOffer = async (offerId: Hex, blockNumber: bigint): Promise<OfferState> => {
    const o = await client.readContract({
      address: market,
      abi: marketAbi,
      functionName: "getOffer",
      args: [offerId],
      blockNumber,
    });
    return {
      offerId: normalizeHex(offerId),
      modelId: normalizeHex(o.modelId),
      owner: normalizeHex(o.owner),
      operator: normalizeHex(o.operator),
      payout: normalizeHex(o.payout),
      status: offerStatuses[o.status] ?? "retired",
      tariff: {
        version: BigInt(o.tariff.version),
        inputPricePerMTok: o.tariff.inputPricePerMTok,
        outputPricePerMTok: o.tariff.outputPricePerMTok,
        wakeFee: o.tariff.wakeFee,
      },
      region: o.metadata.region,
      hardware: o.metadata.hardware,
      maxConcurrency: Number(o.metadata.maxConcurrency),
      capabilities: parseCapabilities(o.metadata.capabilities),
    };
  };

  const syncOnce = async (): Promise<SyncResult | undefined> => {
    const head = await client.getBlockNumber({ cacheTime: 0 });
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
    for (const event of events) {
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
    const models = await Promise.all([...modelIds].map((id) => readModel(id, toBlock)));
    const offers = await Promise.all([...offerIds].map((id) => readOffer(id, toBlock)));

    const db = await pool.connect();
    try {
      await db.query("BEGIN");
      for (const model of models) await upsertModel(db, model, toBlock);
      for (const offer of offers) await upsertOffer(db, offer, toBlock);
      for (const c of closings)
        await recordPermitClosing(db, c.permitId, c.closableAt, c.blockNumber);
      await advanceCursor(db, cursorName, toBlock);
      await db.query("COMMIT");
    } catch (error) {
      await db.query("ROLLBACK").catch(() => undefined);
      throw error;
    } finally {
      db.release();
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
