import { pino } from "pino";
import { startGateway } from "../src/app.js";
import { parseConfig } from "../src/config.js";
import { createLogger } from "../src/runtime/logger.js";
import { announceReady, serveControl } from "./child.js";

/**
 * The gateway under test, in its own process, configured exactly as production is: through
 * `parseConfig` on the environment the runner hands it (RPC_URL, CHAIN_ID, MARKET_ADDRESS,
 * DATABASE_URL, ...). Logs go to stderr so that stdout carries only the ready line.
 */

const config = parseConfig(process.env);
const logger = createLogger(config.logLevel, pino.destination(2));
const gateway = await startGateway(config, { logger });
serveControl(() => gateway.close());
announceReady("gateway", gateway.url);
