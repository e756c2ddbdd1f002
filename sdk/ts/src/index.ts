export { connect, SluiceClient } from "./client.js";
export { SluiceError } from "./errors.js";
export { LiveQueryStore, TopicStore, type LiveQueryState, type TopicState } from "./store.js";
export type {
  Client,
  ClientStatus,
  ConnectOptions,
  Durability,
  Encoding,
  LiveOptions,
  LiveQuery,
  LiveStatus,
  MutateResult,
  Op,
  Params,
  QueryResult,
  GetResult,
  GetManyResult,
  FindResult,
  SqlReply,
  SqlStatementResult,
  TokenSource,
  TopicRecord,
  TopicWatch,
  WatchOptions,
  WriteResult,
} from "./types.js";
