import type { Hex } from "viem";
import type { OfferKeyBinding, OfferKeyBindingStore } from "../../domain/offer-key-binding.js";
import type { Queryable } from "./api-keys.js";

interface Row {
  id: string;
  offer_id: string;
  api_key_id: string;
  operator: string;
  expires_at: string;
  created_at: string;
  revoked_at: string | null;
}

const columns = "id, offer_id, api_key_id, operator, expires_at, created_at, revoked_at";

function fromRow(r: Row): OfferKeyBinding {
  return {
    id: r.id,
    offerId: r.offer_id as Hex,
    apiKeyId: r.api_key_id,
    operator: r.operator as Hex,
    expiresAt: Number(r.expires_at),
    createdAt: Number(r.created_at),
    revokedAt: r.revoked_at === null ? null : Number(r.revoked_at),
  };
}

/**
 * The `offer_key_bindings` table (migration 022). `ON CONFLICT DO NOTHING` on (operator, nonce)
 * makes claiming the nonce and storing the binding one step: of two submissions of one signed
 * payload, exactly one is stored.
 */
export function createPgOfferKeyBindingStore(db: Queryable): OfferKeyBindingStore {
  return {
    async insert(b, proof) {
      const { rowCount } = await db.query(
        `INSERT INTO offer_key_bindings
           (id, offer_id, api_key_id, operator, expires_at, nonce, signature, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (operator, nonce) DO NOTHING`,
        [
          b.id,
          b.offerId,
          b.apiKeyId,
          b.operator,
          b.expiresAt,
          proof.nonce,
          proof.signature,
          b.createdAt,
        ],
      );
      return rowCount === 1 ? "inserted" : "nonce_used";
    },

    async revoke({ id, offerId, apiKeyId, now }) {
      // The first revocation's time stays; revoking again answers the binding unchanged.
      const { rows } = await db.query<Row>(
        `UPDATE offer_key_bindings SET revoked_at = COALESCE(revoked_at, $4)
         WHERE id = $1 AND offer_id = $2 AND api_key_id = $3
         RETURNING ${columns}`,
        [id, offerId, apiKeyId, now],
      );
      return rows[0] === undefined ? undefined : fromRow(rows[0]);
    },

    async active(apiKeyId, offerId, now) {
      const { rows } = await db.query<Row>(
        `SELECT ${columns} FROM offer_key_bindings
         WHERE api_key_id = $1 AND offer_id = $2 AND revoked_at IS NULL AND expires_at > $3
         ORDER BY seq DESC`,
        [apiKeyId, offerId, now],
      );
      return rows.map(fromRow);
    },

    async activeOfKey(apiKeyId, now) {
      // offer_key_bindings_key_offer (api_key_id, offer_id) finds the key's rows.
      const { rows } = await db.query<Row>(
        `SELECT ${columns} FROM offer_key_bindings
         WHERE api_key_id = $1 AND revoked_at IS NULL AND expires_at > $2
         ORDER BY seq DESC`,
        [apiKeyId, now],
      );
      return rows.map(fromRow);
    },
  };
}
