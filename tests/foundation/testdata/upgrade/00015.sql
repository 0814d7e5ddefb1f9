-- What a bridge at schema 00015 (the schema when the upgrade test was
-- written: its later migrations must keep this data) leaves behind: a host with its report, an
-- instance with a direct-path vGPU attached by a finished request (its
-- event, decision, command and audit record) and a load window of the
-- five fields reports carry since.
INSERT INTO hosts (name, node, agent_version, driver_version, last_report_at, report)
VALUES ('cmp-up-1', 'cmp-up-1.nodes', '0.0.9', '550.54.16', now(),
        '{"v": 1, "host": "cmp-up-1", "node": "cmp-up-1.nodes", "agent_version": "0.0.9", "driver_version": "550.54.16",
          "gpus": [{"pci": "0000:3b:00.0", "types": [], "active": [{"mdev_uuid": "4b20d080-1b54-4048-85b3-a6a62d165c01",
          "type_id": "nvidia-232", "instance_uuid": "0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01", "owner": "agent",
          "util_percent": 40, "fb_used_mib": 1024}], "health": "ok"}]}');
INSERT INTO instances (uuid, project_id, user_id, host, node, vm_state, power_state, flavor, vgpus, last_event_type, last_event_at, guest_driver)
VALUES ('0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01', 'p-up', 'u-up', 'cmp-up-1', 'cmp-up-1.nodes', 'active', 'running',
        '{"name": "m1.large", "extra_specs": {}}', 0, 'instance.create.end', now(), '550.54.15');
INSERT INTO events (id, source, message_id, event_type, instance_uuid, payload, processed_at)
VALUES (9001, 'webhook:sched', 'm-up-1', 'GPU_REQUEST', '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01',
        '{"type": "GPU_REQUEST", "vgpu_profile": "T4-4Q"}', now());
INSERT INTO requests (id, source, kind, instance_uuid, state, phase, reason, body, finished_at)
VALUES ('7e0c2a52-9d1b-4a9a-8f5e-0c2d3b4a5f01', 'webhook:sched', 'GPU_REQUEST', '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01',
        'succeeded', 'done', 'attached T4-4Q', '{"type": "GPU_REQUEST", "vgpu_profile": "T4-4Q"}', now());
INSERT INTO decisions (event_id, request_id, instance_uuid, policy, decision, replica)
VALUES (9001, '7e0c2a52-9d1b-4a9a-8f5e-0c2d3b4a5f01', '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01', 'sha256:up',
        '{"intents": [{"action": "attach", "profile": "T4-4Q", "count": 1}]}', 'bridge-1');
INSERT INTO commands (id, request_id, host, kind, body, sent_at, result_status, finished_at, seq, attachment_id, instance_uuid)
VALUES ('a1b2c3d4-0000-4000-8000-000000000001', '7e0c2a52-9d1b-4a9a-8f5e-0c2d3b4a5f01', 'cmp-up-1', 'attach_vgpu',
        '{"v": 1, "id": "a1b2c3d4-0000-4000-8000-000000000001", "kind": "attach_vgpu", "host": "cmp-up-1"}',
        now(), 'succeeded', now(), 0, '4b20d080-1b54-4048-85b3-a6a62d165c01', '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01');
INSERT INTO vgpu_attachments (id, instance_uuid, request_id, host, node, amount, pci_address, type_id, profile, mode, state, frame_rate_limit)
VALUES ('4b20d080-1b54-4048-85b3-a6a62d165c01', '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01', '7e0c2a52-9d1b-4a9a-8f5e-0c2d3b4a5f01',
        'cmp-up-1', 'cmp-up-1.nodes', 1, '0000:3b:00.0', 'nvidia-232', 'T4-4Q', 'live', 'attached', true);
INSERT INTO instance_load (instance_uuid, host, samples)
VALUES ('0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01', 'cmp-up-1',
        jsonb_build_array(jsonb_build_array(round(extract(epoch FROM now())) - 60, 35, 1024, 10, null),
                          jsonb_build_array(round(extract(epoch FROM now())), 45, 1024, 12, 3)));
INSERT INTO audit_log (actor, action, object_type, object_id, request_id, detail)
VALUES ('bridge', 'attach', 'instance', '0d1d9d4f-7b4b-4c4e-9a39-3f8f1a2b3c01', '7e0c2a52-9d1b-4a9a-8f5e-0c2d3b4a5f01', '{"profile": "T4-4Q"}');
