export * from "./types.js";
export type * from "./ports.js";
export { createInference } from "./pipeline.js";
export { rankCandidates } from "./routing.js";
