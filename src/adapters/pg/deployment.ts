import { BaseError } from "../../domain/base-error.js";
import type { Queryable } from "./api-keys.js";

/**
 * The gateway deployment id (issue 37, item 8; migrations 027 and 034): configured per
 * environment (GATEWAY_DEPLOYMENT_ID) and kept in the database, and the two must agree. Every
 * signature a payer or an operator makes for this gateway names it, so a database restored
 * elsewhere, or a staging clone of production's, must not answer to production's id.
 */

/** The shape of a configured deployment id (the ones migration 027 makes: `dep_` + 32 hex). */
export const deploymentIdPattern = /^dep_[0-9A-Za-z_-]{1,124}$/;

/** The configuration and the database name different deployments: the gateway does not start. */
export class DeploymentMismatchError extends BaseError {
  override readonly name = "DeploymentMismatchError";
  readonly reason = "deployment_mismatch";
}

interface DeploymentRow {
  id: string;
  configured_at: Date | null;
}

async function row(db: Queryable): Promise<DeploymentRow> {
  const { rows } = await db.query<DeploymentRow>(
    "SELECT id, configured_at FROM gateway_deployment",
  );
  const found = rows[0];
  if (found === undefined) throw new Error("gateway_deployment has no row (migration 027)");
  return found;
}

/** Whether anything signed for the database's deployment is stored (or was revoked) in it. */
async function holdsSignatures(db: Queryable): Promise<boolean> {
  const { rows } = await db.query<{ held: boolean }>(
    `SELECT EXISTS (SELECT 1 FROM permit_authorizations)
         OR EXISTS (SELECT 1 FROM offer_key_bindings)
         OR EXISTS (SELECT 1 FROM payer_epochs)
         OR EXISTS (SELECT 1 FROM payer_scope_epochs) AS held`,
  );
  return rows[0]?.held === true;
}

const howToChoose = (configured: string, stored: string) =>
  `If this database now serves ${configured} (a restored or cloned database for this environment), ` +
  `run 'gateway deployment adopt' with this configuration: signatures made for ${stored} are then refused here. ` +
  `If the configuration is wrong, set GATEWAY_DEPLOYMENT_ID=${stored}.`;

/**
 * The deployment id this gateway answers to, once the configuration (`configured`, absent when
 * GATEWAY_DEPLOYMENT_ID is unset) and the database agree:
 * - the same id: it (and the row records that a configuration named it);
 * - none configured: the database's, unless a configuration named it before (then refused: the
 *   configuration lost its id); `warning` asks for it to be set;
 * - another id: refused ({@link DeploymentMismatchError}, naming both), unless the database never
 *   had an id configured and holds no signature yet (a new database): it takes the configured id.
 */
export async function settleDeployment(
  db: Queryable,
  configured: string | undefined,
): Promise<{ id: string; warning?: string }> {
  const stored = await row(db);
  if (configured === undefined) {
    if (stored.configured_at !== null)
      throw new DeploymentMismatchError(
        `GATEWAY_DEPLOYMENT_ID is not set, but this database's deployment ${stored.id} was configured ` +
          `(${stored.configured_at.toISOString()}): set GATEWAY_DEPLOYMENT_ID=${stored.id}, or another id and run 'gateway deployment adopt'`,
      );
    return {
      id: stored.id,
      warning:
        `GATEWAY_DEPLOYMENT_ID is not set: using this database's deployment ${stored.id}; set it, ` +
        "so that a restored backup or a clone of this database in another environment is caught",
    };
  }
  if (configured === stored.id) {
    if (stored.configured_at === null)
      await db.query(
        "UPDATE gateway_deployment SET configured_at = now() WHERE configured_at IS NULL",
      );
    return { id: stored.id };
  }
  if (stored.configured_at === null && !(await holdsSignatures(db))) {
    await db.query("UPDATE gateway_deployment SET id = $1, configured_at = now() WHERE id = $2", [
      configured,
      stored.id,
    ]);
    return { id: configured };
  }
  throw new DeploymentMismatchError(
    `GATEWAY_DEPLOYMENT_ID is ${configured}, but this database's deployment is ${stored.id}: ` +
      `the gateway does not start. ${howToChoose(configured, stored.id)}`,
  );
}

/**
 * `gateway deployment adopt`: the operator says the configuration holds. The database's id
 * becomes `configured`; what is stored stays (authorizations made for the old id keep working
 * until they expire or are revoked), but a signature made for the old id and submitted from now
 * on is refused (`wrong_deployment`).
 */
export async function adoptDeployment(
  db: Queryable,
  configured: string,
): Promise<{ previous: string; id: string }> {
  const stored = await row(db);
  await db.query("UPDATE gateway_deployment SET id = $1, configured_at = now()", [configured]);
  return { previous: stored.id, id: configured };
}

/** The database's deployment and when a configuration first named it (null: never). */
export async function storedDeployment(
  db: Queryable,
): Promise<{ id: string; configuredAt: Date | null }> {
  const stored = await row(db);
  return { id: stored.id, configuredAt: stored.configured_at };
}
