import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startGateway } from "../src/app.js";
import { deploymentId } from "../src/adapters/pg/permit-authorizations.js";
import type { FakeUpstream } from "./helpers/fake-upstream.js";
import { startChatStack, type TestStack } from "./helpers/stack.js";

/**
 * Issue 37, item 8: a gateway whose configured deployment (GATEWAY_DEPLOYMENT_ID) differs from its
 * database's does not start, and says which two differ (a restored backup, a staging clone).
 */
describe("a gateway configured for another deployment than its database's", () => {
  let stack: TestStack;
  let fake: FakeUpstream;
  beforeAll(async () => {
    ({ stack, fake } = await startChatStack());
  }, 120_000);
  afterAll(async () => {
    await fake?.stop();
    await stack?.close();
  });

  it("refuses to start, naming both; the database's own id starts", async () => {
    const stored = await deploymentId(stack.database.db.pool);
    const other = `dep_${"c3".repeat(16)}`;
    await expect(
      startGateway(
        { ...stack.config, deploymentId: other },
        { logger: stack.logger, database: stack.database.db },
      ),
    ).rejects.toThrow(
      `GATEWAY_DEPLOYMENT_ID is ${other}, but this database's deployment is ${stored}: the gateway does not start.`,
    );
    const same = await startGateway(
      { ...stack.config, deploymentId: stored },
      { logger: stack.logger, database: stack.database.db },
    );
    await same.close();
  }, 60_000);
});
