// Package nova decodes what Nova says on the wire: the oslo.messaging
// notification envelope (messagingv2 "2.0" and the legacy un-enveloped form),
// the inner notification message, and the versioned nova_object payloads the
// bridge acts on (instance actions and updates, flavors, compute tasks and
// service status). It also parses the vGPU demand carried by a flavor's
// extra specs.
//
// The package is pure: no I/O, no clocks, no globals. Test-only helpers (the
// $ref resolver for Nova's notification samples) live in package novatest.
package nova
