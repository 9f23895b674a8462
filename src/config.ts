/**
 * The configurations, parsed once from the environment into frozen objects (every key is
 * documented in README.md, "Configuration"): the gateway's own (src/config/gateway.ts), those of
 * the commands that do not run it (src/config/commands.ts), and what they are read with
 * (src/config/read.ts).
 */
export {
  parseLocalConfig,
  parseSettleConfig,
  parsePayerChainConfig,
  parseSigningChainConfig,
  parseGatewayClientConfig,
  type LocalConfig,
  type SettleConfig,
  type PayerChainConfig,
  type SigningChainConfig,
  type GatewayClientConfig,
} from "./config/commands.js";
export { parseConfig, type Config } from "./config/gateway.js";
export { ConfigError, logLevels, type LogLevel } from "./config/read.js";
