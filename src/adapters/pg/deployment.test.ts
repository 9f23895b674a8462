import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createTestDatabase, type TestDatabase } from "../../../test/helpers/db.js";
import {
  adoptDeployment,
  DeploymentMismatchError,
  settleDeployment,
  storedDeployment,
} from "./deployment.js";

let test: TestDatabase;
beforeEach(async () => {
  test = await createTestDatabase();
});
afterEach(async () => {
  await test?.drop();
});

const production = `dep_${"a1".repeat(16)}`;
const staging = `dep_${"b2".repeat(16)}`;

describe("the deployment id: configured per environment, agreeing with the database's (migration 034)", () => {
  it("unset: the database's, with a warning; a new database takes the configured id once", async () => {
    const made = (await storedDeployment(test.db.pool)).id;
    expect(made).toMatch(/^dep_[0-9a-f]{32}$/);
    expect(await settleDeployment(test.db.pool, undefined)).toEqual({
      id: made,
      warning: `GATEWAY_DEPLOYMENT_ID is not set: using this database's deployment ${made}; set it, so that a restored backup or a clone of this database in another environment is caught`,
    });
    // Never configured and holding no signature: the configuration's id is taken.
    expect(await settleDeployment(test.db.pool, production)).toEqual({ id: production });
    expect((await storedDeployment(test.db.pool)).id).toBe(production);
    expect(await settleDeployment(test.db.pool, production)).toEqual({ id: production });
  });

  it("another configured id than the database's: refused, naming both, until adopted", async () => {
    await settleDeployment(test.db.pool, production);
    // The staging environment runs on a copy of production's database.
    const refused = settleDeployment(test.db.pool, staging);
    await expect(refused).rejects.toBeInstanceOf(DeploymentMismatchError);
    await expect(refused).rejects.toThrow(
      `GATEWAY_DEPLOYMENT_ID is ${staging}, but this database's deployment is ${production}: the gateway does not start. ` +
        `If this database now serves ${staging} (a restored or cloned database for this environment), run 'gateway deployment adopt' with this configuration: ` +
        `signatures made for ${production} are then refused here. If the configuration is wrong, set GATEWAY_DEPLOYMENT_ID=${production}.`,
    );
    // A configuration that lost its id is refused too.
    await expect(settleDeployment(test.db.pool, undefined)).rejects.toThrow(
      new RegExp(
        `^GATEWAY_DEPLOYMENT_ID is not set, but this database's deployment ${production} was configured`,
      ),
    );
    expect(await adoptDeployment(test.db.pool, staging)).toEqual({
      previous: production,
      id: staging,
    });
    expect(await settleDeployment(test.db.pool, staging)).toEqual({ id: staging });
  });

  it("a database never configured but holding signatures is not renamed silently", async () => {
    const made = (await storedDeployment(test.db.pool)).id;
    await test.db.pool.query(
      "INSERT INTO payer_epochs (payer, epoch, updated_at) VALUES ('0xaa', 1, 1)",
    );
    await expect(settleDeployment(test.db.pool, staging)).rejects.toThrow(
      `GATEWAY_DEPLOYMENT_ID is ${staging}, but this database's deployment is ${made}`,
    );
    expect((await storedDeployment(test.db.pool)).id).toBe(made);
  });
});
