import type pg from "pg";
import type { Hex } from "viem";
import type {
  CatalogStore,
  JsonValue,
  ModelRecord,
  ModelStatus,
  OfferRecord,
  OfferStatus,
} from "../../domain/catalog.js";
import { declaredHiddenReasoningRatio } from "../../domain/chat/usage.js";
import { isOfferFeature } from "../../domain/offer-features.js";
import type { TokenUnits } from "../../domain/token-units.js";

export type Queryable = Pick<pg.Pool, "query">;

/** A model as the chain states it (what the indexer writes). */
export type ModelState = Omit<ModelRecord, "activeOffers">;
/** An offer as the chain states it (what the indexer writes). */
export type OfferState = Omit<
  OfferRecord,
  | "verifiedAt"
  | "verificationExpiresAt"
  | "verifiedFeatures"
  | "endpointRegistered"
  | "endpointRunning"
  | "inFlight"
>;

interface ModelRow {
  model_id: string;
  creator: string;
  credit_token: string;
  repository: string;
  revision: string;
  task: string;
  pool_id: string;
  position_token_id: string;
  status: ModelStatus;
  active_offers: string;
  quarantine_reason: string | null;
  credit_token_decimals: number | null;
  credit_token_symbol: string | null;
}

interface OfferRow {
  offer_id: string;
  model_id: string;
  owner: string;
  operator: string;
  payout: string;
  status: OfferStatus;
  tariff_version: string;
  input_price_per_mtok: string;
  output_price_per_mtok: string;
  wake_fee: string;
  hidden_reasoning_ratio: number;
  region: string;
  hardware: string;
  max_concurrency: number;
  capabilities: { [key: string]: JsonValue };
  verified_at: string | null;
  verification_expires_at: string | null;
  verified_features: string[] | null;
  endpoint_registered: boolean;
  endpoint_running: boolean | null;
  in_flight: number;
  effective_quarantine: string | null;
}

// Catalog views leave quarantined models and offers out (docs/decisions/catalog-and-indexing.md, "Quarantine"): a
// quarantined model is `model_not_found` everywhere, and neither it nor a quarantined offer is
// listed or counted. Only `getOffer` (health, registration, verification) returns a quarantined
// offer, with its reason (`model_quarantined` when it is its model that is quarantined).
const modelSelect = `
  SELECT m.*, (SELECT count(*) FROM offers o WHERE o.model_id = m.model_id AND o.status = 'active'
      AND o.quarantine_reason IS NULL) AS active_offers,
    t.decimals AS credit_token_decimals, t.symbol AS credit_token_symbol
  FROM models m
  LEFT JOIN credit_tokens t ON t.token = m.credit_token`;

const offerSelect = `
  SELECT o.*, e.verified_at, e.verification_expires_at, e.verified_features,
    (e.offer_id IS NOT NULL) AS endpoint_registered,
    e.running AS endpoint_running, COALESCE(l.in_flight, 0) AS in_flight,
    COALESCE(o.quarantine_reason,
      CASE WHEN m.quarantine_reason IS NOT NULL THEN 'model_quarantined' END) AS effective_quarantine
  FROM offers o
  JOIN models m ON m.model_id = o.model_id
  LEFT JOIN provider_endpoints e ON e.offer_id = o.offer_id
  LEFT JOIN offer_loads l ON l.offer_id = o.offer_id`;

function toModel(row: ModelRow): ModelRecord {
  return {
    modelId: row.model_id as Hex,
    creator: row.creator as Hex,
    creditToken: row.credit_token as Hex,
    repository: row.repository,
    revision: row.revision,
    task: row.task,
    poolId: row.pool_id as Hex,
    positionTokenId: BigInt(row.position_token_id),
    status: row.status,
    activeOffers: Number(row.active_offers),
    ...(row.credit_token_decimals === null
      ? {}
      : { creditTokenDecimals: row.credit_token_decimals }),
    ...(row.credit_token_symbol === null ? {} : { creditTokenSymbol: row.credit_token_symbol }),
    ...(row.quarantine_reason === null ? {} : { quarantineReason: row.quarantine_reason }),
  };
}

function toOffer(row: OfferRow): OfferRecord {
  return {
    offerId: row.offer_id as Hex,
    modelId: row.model_id as Hex,
    owner: row.owner as Hex,
    operator: row.operator as Hex,
    payout: row.payout as Hex,
    status: row.status,
    tariff: {
      version: BigInt(row.tariff_version),
      inputPricePerMTok: BigInt(row.input_price_per_mtok),
      outputPricePerMTok: BigInt(row.output_price_per_mtok),
      wakeFee: BigInt(row.wake_fee),
      // Only where the version has one: a tariff without it reads as before.
      ...(row.hidden_reasoning_ratio > 0
        ? { hiddenReasoningRatio: BigInt(row.hidden_reasoning_ratio) }
        : {}),
    },
    region: row.region,
    hardware: row.hardware,
    maxConcurrency: row.max_concurrency,
    capabilities: row.capabilities,
    verifiedAt: row.verified_at === null ? undefined : Number(row.verified_at),
    verificationExpiresAt:
      row.verification_expires_at === null ? undefined : Number(row.verification_expires_at),
    verifiedFeatures: (row.verified_features ?? []).filter(isOfferFeature),
    endpointRegistered: row.endpoint_registered,
    endpointRunning: row.endpoint_running ?? undefined,
    inFlight: row.in_flight,
    ...(row.effective_quarantine === null ? {} : { quarantineReason: row.effective_quarantine }),
  };
}

export function createPgCatalogStore(db: Queryable): CatalogStore {
  return {
    async listModels(status) {
      const { rows } = await db.query<ModelRow>(
        `${modelSelect} WHERE m.quarantine_reason IS NULL AND ($1::text IS NULL OR m.status = $1)
         ORDER BY m.model_id`,
        [status ?? null],
      );
      return rows.map(toModel);
    },
    async getModel(modelId) {
      const { rows } = await db.query<ModelRow>(
        `${modelSelect} WHERE m.model_id = $1 AND m.quarantine_reason IS NULL`,
        [modelId],
      );
      return rows[0] === undefined ? undefined : toModel(rows[0]);
    },
    async listOffers(modelId, status) {
      const { rows } = await db.query<OfferRow>(
        `${offerSelect} WHERE o.model_id = $1 AND o.quarantine_reason IS NULL
           AND m.quarantine_reason IS NULL AND ($2::text IS NULL OR o.status = $2)
         ORDER BY o.offer_id`,
        [modelId, status ?? null],
      );
      return rows.map(toOffer);
    },
    async getOffer(offerId) {
      const { rows } = await db.query<OfferRow>(`${offerSelect} WHERE o.offer_id = $1`, [offerId]);
      return rows[0] === undefined ? undefined : toOffer(rows[0]);
    },
  };
}

/**
 * What an upsert did: whether the row was written (a row indexed from a later block wins), and
 * the quarantine reason the row had before (null: none, or no row), so that the indexer logs a
 * quarantine once, when it starts, and when it is lifted.
 */
export interface UpsertResult {
  readonly written: boolean;
  readonly previousQuarantine: string | null;
}

/**
 * Serialises the writers of one model or offer until their transaction ends, and reads the
 * quarantine reason the row has then. Gateways indexing the same range at once would otherwise
 * each see the row as it was before the other's write (or no row), and each log the same
 * quarantine.
 */
async function lockEntity(
  db: Queryable,
  table: "models" | "offers",
  id: Hex,
): Promise<string | null> {
  const key = table === "models" ? "model_id" : "offer_id";
  await db.query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", [`gw_${table}:${id}`]);
  const { rows } = await db.query<{ quarantine_reason: string | null }>(
    `SELECT quarantine_reason FROM ${table} WHERE ${key} = $1`,
    [id],
  );
  return rows[0]?.quarantine_reason ?? null;
}

/**
 * Writes a model as read at `block`. A row already indexed from a later block
 * wins, so two gateway processes indexing the same chain never move a model
 * back in time.
 */
export async function upsertModel(
  db: Queryable,
  model: ModelState,
  block: bigint,
): Promise<UpsertResult> {
  const previousQuarantine = await lockEntity(db, "models", model.modelId);
  const { rowCount } = await db.query(
    `INSERT INTO models (model_id, creator, credit_token, repository, revision, task, pool_id,
       position_token_id, status, indexed_block, quarantine_reason)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
     ON CONFLICT (model_id) DO UPDATE SET
       creator = EXCLUDED.creator, credit_token = EXCLUDED.credit_token,
       repository = EXCLUDED.repository, revision = EXCLUDED.revision, task = EXCLUDED.task,
       pool_id = EXCLUDED.pool_id, position_token_id = EXCLUDED.position_token_id,
       status = EXCLUDED.status, indexed_block = EXCLUDED.indexed_block,
       quarantine_reason = EXCLUDED.quarantine_reason, updated_at = now()
     WHERE models.indexed_block <= EXCLUDED.indexed_block`,
    [
      model.modelId,
      model.creator,
      model.creditToken,
      model.repository,
      model.revision,
      model.task,
      model.poolId,
      model.positionTokenId.toString(),
      model.status,
      block.toString(),
      model.quarantineReason ?? null,
    ],
  );
  return { written: (rowCount ?? 0) > 0, previousQuarantine };
}

/**
 * Writes an offer as read at `block` (later reads win, as for models). The hidden reasoning
 * ratio its capabilities declare (`declaredHiddenReasoningRatio`) is a priced term of its tariff
 * version (migration 032): written with a new version, and kept while the version stands, so a
 * change of the capabilities alone changes nothing until the offer's tariff changes.
 */
export async function upsertOffer(
  db: Queryable,
  offer: OfferState,
  block: bigint,
): Promise<UpsertResult> {
  const previousQuarantine = await lockEntity(db, "offers", offer.offerId);
  const { rowCount } = await db.query(
    `INSERT INTO offers (offer_id, model_id, owner, operator, payout, status, tariff_version,
       input_price_per_mtok, output_price_per_mtok, wake_fee, region, hardware, max_concurrency,
       capabilities, indexed_block, quarantine_reason, hidden_reasoning_ratio)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
     ON CONFLICT (offer_id) DO UPDATE SET
       model_id = EXCLUDED.model_id, owner = EXCLUDED.owner, operator = EXCLUDED.operator,
       payout = EXCLUDED.payout, status = EXCLUDED.status, tariff_version = EXCLUDED.tariff_version,
       input_price_per_mtok = EXCLUDED.input_price_per_mtok,
       output_price_per_mtok = EXCLUDED.output_price_per_mtok, wake_fee = EXCLUDED.wake_fee,
       hidden_reasoning_ratio = CASE WHEN offers.tariff_version = EXCLUDED.tariff_version
         THEN offers.hidden_reasoning_ratio ELSE EXCLUDED.hidden_reasoning_ratio END,
       region = EXCLUDED.region, hardware = EXCLUDED.hardware,
       max_concurrency = EXCLUDED.max_concurrency, capabilities = EXCLUDED.capabilities,
       indexed_block = EXCLUDED.indexed_block, quarantine_reason = EXCLUDED.quarantine_reason,
       updated_at = now()
     WHERE offers.indexed_block <= EXCLUDED.indexed_block`,
    [
      offer.offerId,
      offer.modelId,
      offer.owner,
      offer.operator,
      offer.payout,
      offer.status,
      offer.tariff.version.toString(),
      offer.tariff.inputPricePerMTok.toString(),
      offer.tariff.outputPricePerMTok.toString(),
      offer.tariff.wakeFee.toString(),
      offer.region,
      offer.hardware,
      offer.maxConcurrency,
      JSON.stringify(offer.capabilities),
      block.toString(),
      offer.quarantineReason ?? null,
      Number(declaredHiddenReasoningRatio(offer.capabilities)),
    ],
  );
  return { written: (rowCount ?? 0) > 0, previousQuarantine };
}

/** Which of `modelIds` have a row (quarantined or not), for the indexer. */
export async function existingModels(db: Queryable, modelIds: readonly Hex[]): Promise<Set<Hex>> {
  if (modelIds.length === 0) return new Set();
  const { rows } = await db.query<{ model_id: string }>(
    "SELECT model_id FROM models WHERE model_id = ANY($1::text[])",
    [modelIds],
  );
  return new Set(rows.map((r) => r.model_id as Hex));
}

export async function readCursor(db: Queryable, name: string): Promise<bigint | undefined> {
  const { rows } = await db.query<{ block_number: string }>(
    "SELECT block_number FROM chain_cursors WHERE name = $1",
    [name],
  );
  return rows[0] === undefined ? undefined : BigInt(rows[0].block_number);
}

/** Moves the cursor forward only (a slower process never rewinds it). */
export async function advanceCursor(db: Queryable, name: string, block: bigint): Promise<void> {
  await db.query(
    `INSERT INTO chain_cursors (name, block_number) VALUES ($1, $2)
     ON CONFLICT (name) DO UPDATE SET block_number = GREATEST(chain_cursors.block_number, EXCLUDED.block_number),
       updated_at = now()`,
    [name, block.toString()],
  );
}

/** Of `tokens`, those whose decimals and symbol were read already (a row in `credit_tokens`). */
export async function knownCreditTokens(
  db: Queryable,
  tokens: readonly string[],
): Promise<Set<string>> {
  const { rows } = await db.query<{ token: string }>(
    "SELECT token FROM credit_tokens WHERE token = ANY($1::text[])",
    [tokens],
  );
  return new Set(rows.map((r) => r.token));
}

/**
 * Credit tokens of indexed models never read (models indexed before migration 040): up to
 * `limit` of them, for the indexer to read on its next pass.
 */
export async function unrecordedCreditTokens(db: Queryable, limit: number): Promise<Hex[]> {
  const { rows } = await db.query<{ credit_token: Hex }>(
    `SELECT DISTINCT m.credit_token FROM models m
     WHERE NOT EXISTS (SELECT 1 FROM credit_tokens t WHERE t.token = m.credit_token)
     LIMIT $1`,
    [limit],
  );
  return rows.map((r) => r.credit_token);
}

/**
 * Records a credit token's decimals and symbol as read at `block` (undefined: unknown), once: a
 * token already recorded keeps its first row (read once per token, migration 040).
 */
export async function recordCreditToken(
  db: Queryable,
  token: string,
  units: TokenUnits,
  block: bigint,
): Promise<void> {
  await db.query(
    `INSERT INTO credit_tokens (token, decimals, symbol, read_block) VALUES ($1, $2, $3, $4)
     ON CONFLICT (token) DO NOTHING`,
    [token, units.decimals ?? null, units.symbol ?? null, block.toString()],
  );
}
