// Package flow is the vocabulary of a request's way through the bridge,
// shared by the pipeline and the paths that act for it: the Plan a
// decision becomes and its Steps, the phases of a request in flight, the
// codes a request closes with, and the states of a direct-path vGPU
// (Attachment).
//
// It holds types and constants only and imports no package of bridge/,
// so every bridge package can use it without importing the pipeline.
package flow
