BEGIN TRANSACTION;
CREATE TABLE actions (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    position    INTEGER NOT NULL,
    name        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'skipped', 'cancelled')),
    exit_code   INTEGER,
    started_at  TEXT,
    finished_at TEXT,
    UNIQUE (run_id, position)
);
INSERT INTO "actions" VALUES(1,1,1,'parse-workflow','succeeded',0,'2026-11-02T03:02:52Z','2026-11-02T03:02:53Z');
INSERT INTO "actions" VALUES(2,1,2,'checkout','succeeded',0,'2026-11-02T03:02:55Z','2026-11-02T03:03:03Z');
INSERT INTO "actions" VALUES(3,1,3,'install','succeeded',0,'2026-11-02T03:03:05Z','2026-11-02T03:03:31Z');
INSERT INTO "actions" VALUES(4,1,4,'lint','succeeded',0,'2026-11-02T03:03:31Z','2026-11-02T03:03:57Z');
INSERT INTO "actions" VALUES(5,1,5,'build','succeeded',0,'2026-11-02T03:03:58Z','2026-11-02T03:05:41Z');
INSERT INTO "actions" VALUES(6,1,6,'test','succeeded',0,'2026-11-02T03:05:44Z','2026-11-02T03:15:27Z');
INSERT INTO "actions" VALUES(7,2,1,'parse-workflow','succeeded',0,'2026-11-03T15:51:24Z','2026-11-03T15:51:25Z');
INSERT INTO "actions" VALUES(8,2,2,'checkout','succeeded',0,'2026-11-03T15:51:27Z','2026-11-03T15:51:36Z');
INSERT INTO "actions" VALUES(9,2,3,'install','succeeded',0,'2026-11-03T15:51:36Z','2026-11-03T15:53:06Z');
INSERT INTO "actions" VALUES(10,2,4,'lint','succeeded',0,'2026-11-03T15:53:09Z','2026-11-03T15:53:43Z');
INSERT INTO "actions" VALUES(11,2,5,'build','succeeded',0,'2026-11-03T15:53:45Z','2026-11-03T15:55:37Z');
INSERT INTO "actions" VALUES(12,2,6,'test','succeeded',0,'2026-11-03T15:55:39Z','2026-11-03T16:03:34Z');
INSERT INTO "actions" VALUES(13,3,1,'parse-workflow','succeeded',0,'2026-11-04T17:24:39Z','2026-11-04T17:24:41Z');
INSERT INTO "actions" VALUES(14,3,2,'checkout','succeeded',0,'2026-11-04T17:24:42Z','2026-11-04T17:24:47Z');
INSERT INTO "actions" VALUES(15,3,3,'install','succeeded',0,'2026-11-04T17:24:48Z','2026-11-04T17:25:19Z');
INSERT INTO "actions" VALUES(16,3,4,'lint','succeeded',0,'2026-11-04T17:25:19Z','2026-11-04T17:25:47Z');
INSERT INTO "actions" VALUES(17,3,5,'build','succeeded',0,'2026-11-04T17:25:48Z','2026-11-04T17:28:02Z');
INSERT INTO "actions" VALUES(18,3,6,'test','succeeded',0,'2026-11-04T17:28:03Z','2026-11-04T17:29:23Z');
INSERT INTO "actions" VALUES(19,4,1,'parse-workflow','succeeded',0,'2026-11-06T02:54:28Z','2026-11-06T02:54:29Z');
INSERT INTO "actions" VALUES(20,4,2,'checkout','succeeded',0,'2026-11-06T02:54:31Z','2026-11-06T02:54:36Z');
INSERT INTO "actions" VALUES(21,4,3,'install','succeeded',0,'2026-11-06T02:54:39Z','2026-11-06T02:55:50Z');
INSERT INTO "actions" VALUES(22,4,4,'lint','succeeded',0,'2026-11-06T02:55:53Z','2026-11-06T02:56:20Z');
INSERT INTO "actions" VALUES(23,4,5,'build','succeeded',0,'2026-11-06T02:56:20Z','2026-11-06T02:57:32Z');
INSERT INTO "actions" VALUES(24,4,6,'test','succeeded',0,'2026-11-06T02:57:35Z','2026-11-06T03:06:56Z');
INSERT INTO "actions" VALUES(25,5,1,'parse-workflow','succeeded',0,'2026-11-07T14:07:05Z','2026-11-07T14:07:07Z');
INSERT INTO "actions" VALUES(26,5,2,'checkout','succeeded',0,'2026-11-07T14:07:07Z','2026-11-07T14:07:09Z');
INSERT INTO "actions" VALUES(27,5,3,'install','succeeded',0,'2026-11-07T14:07:09Z','2026-11-07T14:07:45Z');
INSERT INTO "actions" VALUES(28,5,4,'build','succeeded',0,'2026-11-07T14:07:45Z','2026-11-07T14:11:10Z');
INSERT INTO "actions" VALUES(29,5,5,'test','succeeded',0,'2026-11-07T14:11:11Z','2026-11-07T14:16:28Z');
INSERT INTO "actions" VALUES(30,5,6,'publish','succeeded',0,'2026-11-07T14:16:31Z','2026-11-07T14:16:48Z');
INSERT INTO "actions" VALUES(31,5,7,'deploy','succeeded',0,'2026-11-07T14:16:48Z','2026-11-07T14:17:51Z');
INSERT INTO "actions" VALUES(32,6,1,'parse-workflow','succeeded',0,'2026-11-08T21:23:35Z','2026-11-08T21:23:37Z');
INSERT INTO "actions" VALUES(33,6,2,'checkout','succeeded',0,'2026-11-08T21:23:39Z','2026-11-08T21:23:41Z');
INSERT INTO "actions" VALUES(34,6,3,'install','succeeded',0,'2026-11-08T21:23:41Z','2026-11-08T21:24:25Z');
INSERT INTO "actions" VALUES(35,6,4,'lint','succeeded',0,'2026-11-08T21:24:28Z','2026-11-08T21:24:41Z');
INSERT INTO "actions" VALUES(36,6,5,'build','succeeded',0,'2026-11-08T21:24:43Z','2026-11-08T21:26:21Z');
INSERT INTO "actions" VALUES(37,6,6,'test','succeeded',0,'2026-11-08T21:26:23Z','2026-11-08T21:31:15Z');
INSERT INTO "actions" VALUES(38,7,1,'parse-workflow','succeeded',0,'2026-11-11T01:03:24Z','2026-11-11T01:03:26Z');
INSERT INTO "actions" VALUES(39,7,2,'checkout','succeeded',0,'2026-11-11T01:03:27Z','2026-11-11T01:03:33Z');
INSERT INTO "actions" VALUES(40,7,3,'install','cancelled',NULL,'2026-11-11T01:03:35Z','2026-11-11T01:04:08Z');
INSERT INTO "actions" VALUES(41,7,4,'lint','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(42,7,5,'build','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(43,7,6,'test','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(44,8,1,'parse-workflow','succeeded',0,'2026-11-12T20:17:15Z','2026-11-12T20:17:16Z');
INSERT INTO "actions" VALUES(45,8,2,'checkout','succeeded',0,'2026-11-12T20:17:17Z','2026-11-12T20:17:19Z');
INSERT INTO "actions" VALUES(46,8,3,'install','succeeded',0,'2026-11-12T20:17:20Z','2026-11-12T20:18:33Z');
INSERT INTO "actions" VALUES(47,8,4,'build','succeeded',0,'2026-11-12T20:18:33Z','2026-11-12T20:20:00Z');
INSERT INTO "actions" VALUES(48,8,5,'test','succeeded',0,'2026-11-12T20:20:02Z','2026-11-12T20:22:57Z');
INSERT INTO "actions" VALUES(49,8,6,'report','succeeded',0,'2026-11-12T20:22:57Z','2026-11-12T20:23:02Z');
INSERT INTO "actions" VALUES(50,9,1,'parse-workflow','succeeded',0,'2026-11-13T06:41:28Z','2026-11-13T06:41:30Z');
INSERT INTO "actions" VALUES(51,9,2,'checkout','succeeded',0,'2026-11-13T06:41:30Z','2026-11-13T06:41:35Z');
INSERT INTO "actions" VALUES(52,9,3,'install','succeeded',0,'2026-11-13T06:41:38Z','2026-11-13T06:42:43Z');
INSERT INTO "actions" VALUES(53,9,4,'lint','succeeded',0,'2026-11-13T06:42:45Z','2026-11-13T06:43:20Z');
INSERT INTO "actions" VALUES(54,9,5,'build','succeeded',0,'2026-11-13T06:43:20Z','2026-11-13T06:44:12Z');
INSERT INTO "actions" VALUES(55,9,6,'test','succeeded',0,'2026-11-13T06:44:13Z','2026-11-13T06:51:34Z');
INSERT INTO "actions" VALUES(56,10,1,'parse-workflow','succeeded',0,'2026-11-14T23:38:29Z','2026-11-14T23:38:31Z');
INSERT INTO "actions" VALUES(57,10,2,'checkout','succeeded',0,'2026-11-14T23:38:32Z','2026-11-14T23:38:35Z');
INSERT INTO "actions" VALUES(58,10,3,'install','succeeded',0,'2026-11-14T23:38:37Z','2026-11-14T23:39:43Z');
INSERT INTO "actions" VALUES(59,10,4,'lint','succeeded',0,'2026-11-14T23:39:43Z','2026-11-14T23:40:07Z');
INSERT INTO "actions" VALUES(60,10,5,'build','succeeded',0,'2026-11-14T23:40:09Z','2026-11-14T23:41:59Z');
INSERT INTO "actions" VALUES(61,10,6,'test','succeeded',0,'2026-11-14T23:41:59Z','2026-11-14T23:43:23Z');
INSERT INTO "actions" VALUES(62,11,1,'parse-workflow','succeeded',0,'2026-11-16T17:07:29Z','2026-11-16T17:07:30Z');
INSERT INTO "actions" VALUES(63,11,2,'checkout','succeeded',0,'2026-11-16T17:07:30Z','2026-11-16T17:07:36Z');
INSERT INTO "actions" VALUES(64,11,3,'install','succeeded',0,'2026-11-16T17:07:37Z','2026-11-16T17:08:27Z');
INSERT INTO "actions" VALUES(65,11,4,'build','succeeded',0,'2026-11-16T17:08:29Z','2026-11-16T17:11:06Z');
INSERT INTO "actions" VALUES(66,11,5,'test','failed',1,'2026-11-16T17:11:06Z','2026-11-16T17:20:50Z');
INSERT INTO "actions" VALUES(67,11,6,'report','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(68,12,1,'parse-workflow','succeeded',0,'2026-11-18T02:41:40Z','2026-11-18T02:41:42Z');
INSERT INTO "actions" VALUES(69,12,2,'checkout','succeeded',0,'2026-11-18T02:41:43Z','2026-11-18T02:41:48Z');
INSERT INTO "actions" VALUES(70,12,3,'install','succeeded',0,'2026-11-18T02:41:49Z','2026-11-18T02:43:02Z');
INSERT INTO "actions" VALUES(71,12,4,'lint','succeeded',0,'2026-11-18T02:43:03Z','2026-11-18T02:43:18Z');
INSERT INTO "actions" VALUES(72,12,5,'build','cancelled',NULL,'2026-11-18T02:43:20Z','2026-11-18T02:45:15Z');
INSERT INTO "actions" VALUES(73,12,6,'test','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(74,13,1,'parse-workflow','succeeded',0,'2026-11-20T02:34:47Z','2026-11-20T02:34:48Z');
INSERT INTO "actions" VALUES(75,13,2,'checkout','succeeded',0,'2026-11-20T02:34:49Z','2026-11-20T02:34:52Z');
INSERT INTO "actions" VALUES(76,13,3,'install','failed',1,'2026-11-20T02:34:55Z','2026-11-20T02:35:19Z');
INSERT INTO "actions" VALUES(77,13,4,'lint','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(78,13,5,'build','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(79,13,6,'test','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(80,14,1,'parse-workflow','succeeded',0,'2026-11-21T18:16:00Z','2026-11-21T18:16:02Z');
INSERT INTO "actions" VALUES(81,14,2,'checkout','succeeded',0,'2026-11-21T18:16:04Z','2026-11-21T18:16:06Z');
INSERT INTO "actions" VALUES(82,14,3,'install','succeeded',0,'2026-11-21T18:16:06Z','2026-11-21T18:17:10Z');
INSERT INTO "actions" VALUES(83,14,4,'lint','succeeded',0,'2026-11-21T18:17:12Z','2026-11-21T18:17:41Z');
INSERT INTO "actions" VALUES(84,14,5,'build','succeeded',0,'2026-11-21T18:17:42Z','2026-11-21T18:18:33Z');
INSERT INTO "actions" VALUES(85,14,6,'test','succeeded',0,'2026-11-21T18:18:35Z','2026-11-21T18:20:14Z');
INSERT INTO "actions" VALUES(86,15,1,'parse-workflow','succeeded',0,'2026-11-23T05:29:43Z','2026-11-23T05:29:44Z');
INSERT INTO "actions" VALUES(87,15,2,'checkout','succeeded',0,'2026-11-23T05:29:47Z','2026-11-23T05:29:50Z');
INSERT INTO "actions" VALUES(88,15,3,'install','succeeded',0,'2026-11-23T05:29:53Z','2026-11-23T05:31:23Z');
INSERT INTO "actions" VALUES(89,15,4,'lint','succeeded',0,'2026-11-23T05:31:23Z','2026-11-23T05:31:41Z');
INSERT INTO "actions" VALUES(90,15,5,'build','succeeded',0,'2026-11-23T05:31:44Z','2026-11-23T05:35:22Z');
INSERT INTO "actions" VALUES(91,15,6,'test','succeeded',0,'2026-11-23T05:35:24Z','2026-11-23T05:41:38Z');
INSERT INTO "actions" VALUES(92,16,1,'parse-workflow','succeeded',0,'2026-11-23T23:15:10Z','2026-11-23T23:15:11Z');
INSERT INTO "actions" VALUES(93,16,2,'checkout','succeeded',0,'2026-11-23T23:15:14Z','2026-11-23T23:15:18Z');
INSERT INTO "actions" VALUES(94,16,3,'install','succeeded',0,'2026-11-23T23:15:21Z','2026-11-23T23:15:55Z');
INSERT INTO "actions" VALUES(95,16,4,'lint','succeeded',0,'2026-11-23T23:15:58Z','2026-11-23T23:16:29Z');
INSERT INTO "actions" VALUES(96,16,5,'build','succeeded',0,'2026-11-23T23:16:32Z','2026-11-23T23:20:29Z');
INSERT INTO "actions" VALUES(97,16,6,'test','succeeded',0,'2026-11-23T23:20:29Z','2026-11-23T23:22:21Z');
INSERT INTO "actions" VALUES(98,17,1,'parse-workflow','succeeded',0,'2026-11-26T05:02:20Z','2026-11-26T05:02:21Z');
INSERT INTO "actions" VALUES(99,17,2,'checkout','succeeded',0,'2026-11-26T05:02:21Z','2026-11-26T05:02:24Z');
INSERT INTO "actions" VALUES(100,17,3,'install','succeeded',0,'2026-11-26T05:02:27Z','2026-11-26T05:03:49Z');
INSERT INTO "actions" VALUES(101,17,4,'lint','succeeded',0,'2026-11-26T05:03:50Z','2026-11-26T05:04:17Z');
INSERT INTO "actions" VALUES(102,17,5,'build','succeeded',0,'2026-11-26T05:04:18Z','2026-11-26T05:05:09Z');
INSERT INTO "actions" VALUES(103,17,6,'test','succeeded',0,'2026-11-26T05:05:12Z','2026-11-26T05:11:34Z');
INSERT INTO "actions" VALUES(104,18,1,'parse-workflow','succeeded',0,'2026-11-27T21:21:52Z','2026-11-27T21:21:54Z');
INSERT INTO "actions" VALUES(105,18,2,'checkout','succeeded',0,'2026-11-27T21:21:55Z','2026-11-27T21:22:04Z');
INSERT INTO "actions" VALUES(106,18,3,'install','succeeded',0,'2026-11-27T21:22:05Z','2026-11-27T21:23:37Z');
INSERT INTO "actions" VALUES(107,18,4,'build','succeeded',0,'2026-11-27T21:23:40Z','2026-11-27T21:26:32Z');
INSERT INTO "actions" VALUES(108,18,5,'test','succeeded',0,'2026-11-27T21:26:34Z','2026-11-27T21:29:40Z');
INSERT INTO "actions" VALUES(109,18,6,'report','succeeded',0,'2026-11-27T21:29:41Z','2026-11-27T21:29:47Z');
INSERT INTO "actions" VALUES(110,19,1,'parse-workflow','succeeded',0,'2026-11-29T07:50:03Z','2026-11-29T07:50:05Z');
INSERT INTO "actions" VALUES(111,19,2,'checkout','succeeded',0,'2026-11-29T07:50:06Z','2026-11-29T07:50:14Z');
INSERT INTO "actions" VALUES(112,19,3,'install','succeeded',0,'2026-11-29T07:50:17Z','2026-11-29T07:51:24Z');
INSERT INTO "actions" VALUES(113,19,4,'lint','succeeded',0,'2026-11-29T07:51:27Z','2026-11-29T07:51:46Z');
INSERT INTO "actions" VALUES(114,19,5,'build','succeeded',0,'2026-11-29T07:51:46Z','2026-11-29T07:52:26Z');
INSERT INTO "actions" VALUES(115,19,6,'test','succeeded',0,'2026-11-29T07:52:29Z','2026-11-29T08:01:25Z');
INSERT INTO "actions" VALUES(116,20,1,'parse-workflow','succeeded',0,'2026-11-30T15:29:31Z','2026-11-30T15:29:33Z');
INSERT INTO "actions" VALUES(117,20,2,'checkout','succeeded',0,'2026-11-30T15:29:33Z','2026-11-30T15:29:35Z');
INSERT INTO "actions" VALUES(118,20,3,'install','succeeded',0,'2026-11-30T15:29:36Z','2026-11-30T15:30:06Z');
INSERT INTO "actions" VALUES(119,20,4,'lint','succeeded',0,'2026-11-30T15:30:08Z','2026-11-30T15:30:48Z');
INSERT INTO "actions" VALUES(120,20,5,'build','succeeded',0,'2026-11-30T15:30:48Z','2026-11-30T15:31:41Z');
INSERT INTO "actions" VALUES(121,20,6,'test','succeeded',0,'2026-11-30T15:31:44Z','2026-11-30T15:35:03Z');
INSERT INTO "actions" VALUES(122,21,1,'parse-workflow','succeeded',0,'2026-12-02T11:51:47Z','2026-12-02T11:51:49Z');
INSERT INTO "actions" VALUES(123,21,2,'checkout','succeeded',0,'2026-12-02T11:51:51Z','2026-12-02T11:51:55Z');
INSERT INTO "actions" VALUES(124,21,3,'install','succeeded',0,'2026-12-02T11:51:57Z','2026-12-02T11:52:52Z');
INSERT INTO "actions" VALUES(125,21,4,'build','succeeded',0,'2026-12-02T11:52:55Z','2026-12-02T11:54:11Z');
INSERT INTO "actions" VALUES(126,21,5,'test','succeeded',0,'2026-12-02T11:54:14Z','2026-12-02T11:58:47Z');
INSERT INTO "actions" VALUES(127,21,6,'publish','succeeded',0,'2026-12-02T11:58:49Z','2026-12-02T11:59:31Z');
INSERT INTO "actions" VALUES(128,21,7,'deploy','succeeded',0,'2026-12-02T11:59:32Z','2026-12-02T12:01:38Z');
INSERT INTO "actions" VALUES(129,22,1,'parse-workflow','succeeded',0,'2026-12-03T02:32:52Z','2026-12-03T02:32:54Z');
INSERT INTO "actions" VALUES(130,22,2,'checkout','succeeded',0,'2026-12-03T02:32:57Z','2026-12-03T02:33:00Z');
INSERT INTO "actions" VALUES(131,22,3,'install','succeeded',0,'2026-12-03T02:33:02Z','2026-12-03T02:34:30Z');
INSERT INTO "actions" VALUES(132,22,4,'lint','succeeded',0,'2026-12-03T02:34:33Z','2026-12-03T02:35:04Z');
INSERT INTO "actions" VALUES(133,22,5,'build','succeeded',0,'2026-12-03T02:35:06Z','2026-12-03T02:37:22Z');
INSERT INTO "actions" VALUES(134,22,6,'test','succeeded',0,'2026-12-03T02:37:23Z','2026-12-03T02:44:31Z');
INSERT INTO "actions" VALUES(135,23,1,'parse-workflow','succeeded',0,'2026-12-04T15:56:35Z','2026-12-04T15:56:37Z');
INSERT INTO "actions" VALUES(136,23,2,'checkout','succeeded',0,'2026-12-04T15:56:37Z','2026-12-04T15:56:39Z');
INSERT INTO "actions" VALUES(137,23,3,'install','failed',1,'2026-12-04T15:56:40Z','2026-12-04T15:57:19Z');
INSERT INTO "actions" VALUES(138,23,4,'lint','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(139,23,5,'build','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(140,23,6,'test','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(141,24,1,'parse-workflow','succeeded',0,'2026-12-06T06:27:38Z','2026-12-06T06:27:40Z');
INSERT INTO "actions" VALUES(142,24,2,'checkout','succeeded',0,'2026-12-06T06:27:41Z','2026-12-06T06:27:49Z');
INSERT INTO "actions" VALUES(143,24,3,'install','succeeded',0,'2026-12-06T06:27:51Z','2026-12-06T06:29:26Z');
INSERT INTO "actions" VALUES(144,24,4,'lint','succeeded',0,'2026-12-06T06:29:28Z','2026-12-06T06:30:06Z');
INSERT INTO "actions" VALUES(145,24,5,'build','succeeded',0,'2026-12-06T06:30:07Z','2026-12-06T06:31:21Z');
INSERT INTO "actions" VALUES(146,24,6,'test','succeeded',0,'2026-12-06T06:31:22Z','2026-12-06T06:34:54Z');
INSERT INTO "actions" VALUES(147,25,1,'parse-workflow','succeeded',0,'2026-12-07T02:18:50Z','2026-12-07T02:18:52Z');
INSERT INTO "actions" VALUES(148,25,2,'checkout','succeeded',0,'2026-12-07T02:18:53Z','2026-12-07T02:18:57Z');
INSERT INTO "actions" VALUES(149,25,3,'install','succeeded',0,'2026-12-07T02:18:57Z','2026-12-07T02:19:22Z');
INSERT INTO "actions" VALUES(150,25,4,'lint','succeeded',0,'2026-12-07T02:19:22Z','2026-12-07T02:19:55Z');
INSERT INTO "actions" VALUES(151,25,5,'build','succeeded',0,'2026-12-07T02:19:56Z','2026-12-07T02:21:36Z');
INSERT INTO "actions" VALUES(152,25,6,'test','succeeded',0,'2026-12-07T02:21:36Z','2026-12-07T02:22:48Z');
INSERT INTO "actions" VALUES(153,26,1,'parse-workflow','succeeded',0,'2026-12-09T02:53:07Z','2026-12-09T02:53:08Z');
INSERT INTO "actions" VALUES(154,26,2,'checkout','succeeded',0,'2026-12-09T02:53:11Z','2026-12-09T02:53:13Z');
INSERT INTO "actions" VALUES(155,26,3,'install','succeeded',0,'2026-12-09T02:53:16Z','2026-12-09T02:54:31Z');
INSERT INTO "actions" VALUES(156,26,4,'lint','succeeded',0,'2026-12-09T02:54:34Z','2026-12-09T02:54:47Z');
INSERT INTO "actions" VALUES(157,26,5,'build','succeeded',0,'2026-12-09T02:54:50Z','2026-12-09T02:56:14Z');
INSERT INTO "actions" VALUES(158,26,6,'test','succeeded',0,'2026-12-09T02:56:14Z','2026-12-09T03:01:41Z');
INSERT INTO "actions" VALUES(159,27,1,'parse-workflow','succeeded',0,'2026-12-10T01:25:18Z','2026-12-10T01:25:20Z');
INSERT INTO "actions" VALUES(160,27,2,'checkout','succeeded',0,'2026-12-10T01:25:22Z','2026-12-10T01:25:28Z');
INSERT INTO "actions" VALUES(161,27,3,'install','succeeded',0,'2026-12-10T01:25:29Z','2026-12-10T01:25:59Z');
INSERT INTO "actions" VALUES(162,27,4,'lint','succeeded',0,'2026-12-10T01:25:59Z','2026-12-10T01:26:17Z');
INSERT INTO "actions" VALUES(163,27,5,'build','succeeded',0,'2026-12-10T01:26:19Z','2026-12-10T01:27:59Z');
INSERT INTO "actions" VALUES(164,27,6,'test','succeeded',0,'2026-12-10T01:28:00Z','2026-12-10T01:31:43Z');
INSERT INTO "actions" VALUES(165,28,1,'parse-workflow','succeeded',0,'2026-12-12T19:41:11Z','2026-12-12T19:41:12Z');
INSERT INTO "actions" VALUES(166,28,2,'checkout','succeeded',0,'2026-12-12T19:41:15Z','2026-12-12T19:41:20Z');
INSERT INTO "actions" VALUES(167,28,3,'install','succeeded',0,'2026-12-12T19:41:22Z','2026-12-12T19:42:09Z');
INSERT INTO "actions" VALUES(168,28,4,'lint','succeeded',0,'2026-12-12T19:42:09Z','2026-12-12T19:42:27Z');
INSERT INTO "actions" VALUES(169,28,5,'build','succeeded',0,'2026-12-12T19:42:28Z','2026-12-12T19:43:16Z');
INSERT INTO "actions" VALUES(170,28,6,'test','succeeded',0,'2026-12-12T19:43:16Z','2026-12-12T19:47:01Z');
INSERT INTO "actions" VALUES(171,29,1,'parse-workflow','succeeded',0,'2026-12-14T01:14:23Z','2026-12-14T01:14:24Z');
INSERT INTO "actions" VALUES(172,29,2,'checkout','succeeded',0,'2026-12-14T01:14:24Z','2026-12-14T01:14:32Z');
INSERT INTO "actions" VALUES(173,29,3,'install','succeeded',0,'2026-12-14T01:14:32Z','2026-12-14T01:15:23Z');
INSERT INTO "actions" VALUES(174,29,4,'lint','succeeded',0,'2026-12-14T01:15:23Z','2026-12-14T01:15:33Z');
INSERT INTO "actions" VALUES(175,29,5,'build','succeeded',0,'2026-12-14T01:15:33Z','2026-12-14T01:19:25Z');
INSERT INTO "actions" VALUES(176,29,6,'test','succeeded',0,'2026-12-14T01:19:27Z','2026-12-14T01:28:35Z');
INSERT INTO "actions" VALUES(177,30,1,'parse-workflow','succeeded',0,'2026-12-14T15:32:05Z','2026-12-14T15:32:07Z');
INSERT INTO "actions" VALUES(178,30,2,'checkout','succeeded',0,'2026-12-14T15:32:09Z','2026-12-14T15:32:11Z');
INSERT INTO "actions" VALUES(179,30,3,'install','succeeded',0,'2026-12-14T15:32:14Z','2026-12-14T15:32:37Z');
INSERT INTO "actions" VALUES(180,30,4,'lint','succeeded',0,'2026-12-14T15:32:37Z','2026-12-14T15:33:07Z');
INSERT INTO "actions" VALUES(181,30,5,'build','succeeded',0,'2026-12-14T15:33:10Z','2026-12-14T15:36:50Z');
INSERT INTO "actions" VALUES(182,30,6,'test','succeeded',0,'2026-12-14T15:36:51Z','2026-12-14T15:39:24Z');
INSERT INTO "actions" VALUES(183,31,1,'parse-workflow','succeeded',0,'2026-12-16T15:42:58Z','2026-12-16T15:43:00Z');
INSERT INTO "actions" VALUES(184,31,2,'checkout','succeeded',0,'2026-12-16T15:43:02Z','2026-12-16T15:43:06Z');
INSERT INTO "actions" VALUES(185,31,3,'install','succeeded',0,'2026-12-16T15:43:08Z','2026-12-16T15:43:55Z');
INSERT INTO "actions" VALUES(186,31,4,'lint','succeeded',0,'2026-12-16T15:43:56Z','2026-12-16T15:44:35Z');
INSERT INTO "actions" VALUES(187,31,5,'build','succeeded',0,'2026-12-16T15:44:36Z','2026-12-16T15:45:44Z');
INSERT INTO "actions" VALUES(188,31,6,'test','cancelled',NULL,'2026-12-16T15:45:44Z','2026-12-16T15:55:06Z');
INSERT INTO "actions" VALUES(189,32,1,'parse-workflow','succeeded',0,'2026-12-18T00:49:18Z','2026-12-18T00:49:19Z');
INSERT INTO "actions" VALUES(190,32,2,'checkout','succeeded',0,'2026-12-18T00:49:22Z','2026-12-18T00:49:27Z');
INSERT INTO "actions" VALUES(191,32,3,'install','succeeded',0,'2026-12-18T00:49:30Z','2026-12-18T00:50:06Z');
INSERT INTO "actions" VALUES(192,32,4,'lint','succeeded',0,'2026-12-18T00:50:06Z','2026-12-18T00:50:36Z');
INSERT INTO "actions" VALUES(193,32,5,'build','succeeded',0,'2026-12-18T00:50:38Z','2026-12-18T00:53:31Z');
INSERT INTO "actions" VALUES(194,32,6,'test','succeeded',0,'2026-12-18T00:53:34Z','2026-12-18T01:00:05Z');
INSERT INTO "actions" VALUES(195,33,1,'parse-workflow','succeeded',0,'2026-12-19T15:48:09Z','2026-12-19T15:48:10Z');
INSERT INTO "actions" VALUES(196,33,2,'checkout','succeeded',0,'2026-12-19T15:48:11Z','2026-12-19T15:48:18Z');
INSERT INTO "actions" VALUES(197,33,3,'install','succeeded',0,'2026-12-19T15:48:20Z','2026-12-19T15:49:00Z');
INSERT INTO "actions" VALUES(198,33,4,'lint','succeeded',0,'2026-12-19T15:49:01Z','2026-12-19T15:49:25Z');
INSERT INTO "actions" VALUES(199,33,5,'build','succeeded',0,'2026-12-19T15:49:25Z','2026-12-19T15:50:47Z');
INSERT INTO "actions" VALUES(200,33,6,'test','succeeded',0,'2026-12-19T15:50:47Z','2026-12-19T15:55:07Z');
INSERT INTO "actions" VALUES(201,34,1,'parse-workflow','succeeded',0,'2026-12-21T23:25:57Z','2026-12-21T23:25:59Z');
INSERT INTO "actions" VALUES(202,34,2,'checkout','succeeded',0,'2026-12-21T23:26:00Z','2026-12-21T23:26:06Z');
INSERT INTO "actions" VALUES(203,34,3,'install','succeeded',0,'2026-12-21T23:26:09Z','2026-12-21T23:26:31Z');
INSERT INTO "actions" VALUES(204,34,4,'lint','succeeded',0,'2026-12-21T23:26:34Z','2026-12-21T23:26:42Z');
INSERT INTO "actions" VALUES(205,34,5,'build','succeeded',0,'2026-12-21T23:26:43Z','2026-12-21T23:29:13Z');
INSERT INTO "actions" VALUES(206,34,6,'test','failed',124,'2026-12-21T23:29:16Z','2026-12-21T23:49:16Z');
INSERT INTO "actions" VALUES(207,35,1,'parse-workflow','succeeded',0,'2026-12-22T06:33:06Z','2026-12-22T06:33:08Z');
INSERT INTO "actions" VALUES(208,35,2,'checkout','succeeded',0,'2026-12-22T06:33:08Z','2026-12-22T06:33:16Z');
INSERT INTO "actions" VALUES(209,35,3,'install','succeeded',0,'2026-12-22T06:33:17Z','2026-12-22T06:34:18Z');
INSERT INTO "actions" VALUES(210,35,4,'lint','succeeded',0,'2026-12-22T06:34:21Z','2026-12-22T06:35:00Z');
INSERT INTO "actions" VALUES(211,35,5,'build','succeeded',0,'2026-12-22T06:35:00Z','2026-12-22T06:35:49Z');
INSERT INTO "actions" VALUES(212,35,6,'test','succeeded',0,'2026-12-22T06:35:50Z','2026-12-22T06:39:34Z');
INSERT INTO "actions" VALUES(213,36,1,'parse-workflow','succeeded',0,'2026-12-24T00:32:56Z','2026-12-24T00:32:58Z');
INSERT INTO "actions" VALUES(214,36,2,'checkout','succeeded',0,'2026-12-24T00:33:01Z','2026-12-24T00:33:10Z');
INSERT INTO "actions" VALUES(215,36,3,'install','succeeded',0,'2026-12-24T00:33:11Z','2026-12-24T00:33:54Z');
INSERT INTO "actions" VALUES(216,36,4,'lint','succeeded',0,'2026-12-24T00:33:54Z','2026-12-24T00:34:24Z');
INSERT INTO "actions" VALUES(217,36,5,'build','succeeded',0,'2026-12-24T00:34:24Z','2026-12-24T00:36:08Z');
INSERT INTO "actions" VALUES(218,36,6,'test','succeeded',0,'2026-12-24T00:36:11Z','2026-12-24T00:38:13Z');
INSERT INTO "actions" VALUES(219,37,1,'parse-workflow','succeeded',0,'2026-12-25T15:05:00Z','2026-12-25T15:05:02Z');
INSERT INTO "actions" VALUES(220,37,2,'checkout','succeeded',0,'2026-12-25T15:05:03Z','2026-12-25T15:05:07Z');
INSERT INTO "actions" VALUES(221,37,3,'install','succeeded',0,'2026-12-25T15:05:08Z','2026-12-25T15:05:36Z');
INSERT INTO "actions" VALUES(222,37,4,'lint','succeeded',0,'2026-12-25T15:05:37Z','2026-12-25T15:06:15Z');
INSERT INTO "actions" VALUES(223,37,5,'build','succeeded',0,'2026-12-25T15:06:16Z','2026-12-25T15:07:33Z');
INSERT INTO "actions" VALUES(224,37,6,'test','succeeded',0,'2026-12-25T15:07:36Z','2026-12-25T15:16:35Z');
INSERT INTO "actions" VALUES(225,38,1,'parse-workflow','succeeded',0,'2026-12-27T11:23:11Z','2026-12-27T11:23:13Z');
INSERT INTO "actions" VALUES(226,38,2,'checkout','succeeded',0,'2026-12-27T11:23:14Z','2026-12-27T11:23:20Z');
INSERT INTO "actions" VALUES(227,38,3,'install','succeeded',0,'2026-12-27T11:23:22Z','2026-12-27T11:24:43Z');
INSERT INTO "actions" VALUES(228,38,4,'lint','cancelled',NULL,'2026-12-27T11:24:43Z','2026-12-27T11:25:14Z');
INSERT INTO "actions" VALUES(229,38,5,'build','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(230,38,6,'test','skipped',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(231,39,1,'parse-workflow','succeeded',0,'2026-12-28T02:04:41Z','2026-12-28T02:04:42Z');
INSERT INTO "actions" VALUES(232,39,2,'checkout','succeeded',0,'2026-12-28T02:04:43Z','2026-12-28T02:04:46Z');
INSERT INTO "actions" VALUES(233,39,3,'install','succeeded',0,'2026-12-28T02:04:48Z','2026-12-28T02:05:40Z');
INSERT INTO "actions" VALUES(234,39,4,'build','succeeded',0,'2026-12-28T02:05:41Z','2026-12-28T02:07:20Z');
INSERT INTO "actions" VALUES(235,39,5,'test','succeeded',0,'2026-12-28T02:07:23Z','2026-12-28T02:14:17Z');
INSERT INTO "actions" VALUES(236,39,6,'report','succeeded',0,'2026-12-28T02:14:18Z','2026-12-28T02:14:24Z');
INSERT INTO "actions" VALUES(237,40,1,'parse-workflow','succeeded',0,'2026-12-29T18:03:10Z','2026-12-29T18:03:11Z');
INSERT INTO "actions" VALUES(238,40,2,'checkout','succeeded',0,'2026-12-29T18:03:14Z','2026-12-29T18:03:17Z');
INSERT INTO "actions" VALUES(239,40,3,'install','succeeded',0,'2026-12-29T18:03:17Z','2026-12-29T18:04:10Z');
INSERT INTO "actions" VALUES(240,40,4,'lint','succeeded',0,'2026-12-29T18:04:11Z','2026-12-29T18:04:49Z');
INSERT INTO "actions" VALUES(241,40,5,'build','succeeded',0,'2026-12-29T18:04:52Z','2026-12-29T18:07:54Z');
INSERT INTO "actions" VALUES(242,40,6,'test','running',NULL,'2026-12-29T18:07:57Z',NULL);
INSERT INTO "actions" VALUES(243,41,1,'parse-workflow','pending',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(244,41,2,'checkout','pending',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(245,41,3,'install','pending',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(246,41,4,'lint','pending',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(247,41,5,'build','pending',NULL,NULL,NULL);
INSERT INTO "actions" VALUES(248,41,6,'test','pending',NULL,NULL,NULL);
CREATE TABLE audit_log (
    id             INTEGER PRIMARY KEY,
    at             TEXT NOT NULL,
    source         TEXT NOT NULL,
    subject        TEXT NOT NULL,
    client         TEXT NOT NULL,
    tool           TEXT NOT NULL,
    action         TEXT,
    outcome        TEXT NOT NULL,
    rule           TEXT,
    proposal_id    INTEGER,
    arguments_hash TEXT,
    detail         TEXT NOT NULL DEFAULT '{}',
    duration_ms    REAL,
    prev_hash      TEXT NOT NULL,
    hash           TEXT NOT NULL
);
INSERT INTO "audit_log" VALUES(1,'2026-12-01T09:46:05.686168+00:00','mcp','alice','fixture','list_projects',NULL,'ran','built-in: read effects are auto',NULL,'44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a','{}',1.435,'0000000000000000000000000000000000000000000000000000000000000000','4484cea5af1bd9d45da2cb3ff224ff0222b3d500aea8ee9969219cc4de69b16f');
INSERT INTO "audit_log" VALUES(2,'2026-12-01T09:46:05.687526+00:00','mcp','alice','fixture','get_run',NULL,'ran','built-in: read effects are auto',NULL,'9c199c861c220d81a6632a1dc2eb49fbadd0a0bae29fa138cab1ff0867502453','{}',1.324,'4484cea5af1bd9d45da2cb3ff224ff0222b3d500aea8ee9969219cc4de69b16f','1aa7db5816b541fcef6df40c2ef4d7336762ba70da8258fa496e840b3cf3a411');
INSERT INTO "audit_log" VALUES(3,'2026-12-01T09:46:05.687585+00:00','mcp','alice','fixture','nope',NULL,'forbidden',NULL,NULL,NULL,'{"arguments": "{}", "error": "unknown_tool"}',0.034,'1aa7db5816b541fcef6df40c2ef4d7336762ba70da8258fa496e840b3cf3a411','fca44d5463e7b1b5aee74d3bb87e3d1e3a368e44937331ef7f44947a624a1f31');
INSERT INTO "audit_log" VALUES(4,'2026-12-01T09:46:05.689565+00:00','mcp','alice','fixture','rerun_run',NULL,'staged','built-in: write effects are approve',1,'329a8f9dd5ec4b320f681394da877175463a19f0621b6050f71fcf103fae1267','{}',1.955,'fca44d5463e7b1b5aee74d3bb87e3d1e3a368e44937331ef7f44947a624a1f31','d6f03e9efdd503a0b5a9e0116a8b6758c82e5ff97256e3ff1704da6d3a8a2bf9');
INSERT INTO "audit_log" VALUES(5,'2026-12-01T09:46:05.690597+00:00','mcp','alice','fixture','rerun_run',NULL,'staged','built-in: write effects are approve',2,'7859fa85aef37dfc46f0da5a0bdee21d2c301fa76cbffe8663fc0f4a25eac86c','{}',1.008,'d6f03e9efdd503a0b5a9e0116a8b6758c82e5ff97256e3ff1704da6d3a8a2bf9','d92880de12f2343e45fdcca274be59889ea379e988f15d79c0583a7e2cfc1127');
INSERT INTO "audit_log" VALUES(6,'2026-12-01T09:46:05.691815+00:00','mcp','alice','fixture','project_variable','set','staged','built-in: write effects are approve',3,'21cda7946f39d2a28ebbc70eff611855a46d75f568e2819c74c576ee105d3dff','{}',1.199,'d92880de12f2343e45fdcca274be59889ea379e988f15d79c0583a7e2cfc1127','744a73027f1b4851c76044fad574696a5ebea3ed4b4a3f3e9cb8e23e213ec2d4');
INSERT INTO "audit_log" VALUES(7,'2026-12-01T09:46:05.693238+00:00','approval','bob','knecht-approve','rerun_run',NULL,'approved','built-in: write effects are approve',1,'329a8f9dd5ec4b320f681394da877175463a19f0621b6050f71fcf103fae1267','{"proposer": "alice"}',NULL,'744a73027f1b4851c76044fad574696a5ebea3ed4b4a3f3e9cb8e23e213ec2d4','09f7e679a98020eb8f98811580355b768ffe5c353028d6f022c4675f8b73d021');
INSERT INTO "audit_log" VALUES(8,'2026-12-01T09:46:05.697691+00:00','approval','bob','knecht-approve','rerun_run',NULL,'executed','built-in: write effects are approve',1,'329a8f9dd5ec4b320f681394da877175463a19f0621b6050f71fcf103fae1267','{"proposer": "alice"}',NULL,'09f7e679a98020eb8f98811580355b768ffe5c353028d6f022c4675f8b73d021','970e92fae477c56ef35f8e44ebc09605f4b911b8cc53ac54fc1f2600018fb6cd');
INSERT INTO "audit_log" VALUES(9,'2026-12-01T09:46:05.699883+00:00','approval','bob','knecht-approve','rerun_run',NULL,'rejected','built-in: write effects are approve',2,'7859fa85aef37dfc46f0da5a0bdee21d2c301fa76cbffe8663fc0f4a25eac86c','{"proposer": "alice", "reason": "not now"}',NULL,'970e92fae477c56ef35f8e44ebc09605f4b911b8cc53ac54fc1f2600018fb6cd','920a9cbd624c158556282041d065333174f3e3b11574c7f427f6a4a99a20db58');
CREATE TABLE branches (
    project_id INTEGER NOT NULL REFERENCES projects(id),
    name       TEXT NOT NULL,
    head_sha   TEXT NOT NULL,
    PRIMARY KEY (project_id, name)
);
INSERT INTO "branches" VALUES(1,'main','a6a3a4506513270e269e0d37f2a74de452e6b438');
INSERT INTO "branches" VALUES(1,'feature/refund-currency','1818e811892f902bd23f0824128b2f330c5c7fd0');
INSERT INTO "branches" VALUES(1,'feature/idempotency-keys','81e74ef5e8e25d940ed904759531985d5d9dc9f8');
INSERT INTO "branches" VALUES(1,'feature/sca-flow','6b0d549b6f03675a1600a35a099950d836f675cc');
INSERT INTO "branches" VALUES(1,'fix/flaky-test','0f21ddb66cad4a268d116ece1738f7d93d9c1724');
INSERT INTO "branches" VALUES(2,'main','6b4013ef254b0c4e010c4759482c9cbc43435cc5');
INSERT INTO "branches" VALUES(2,'feature/status-watch','519088f590fbbd119c1caaf75e8766ed88daf401');
INSERT INTO "branches" VALUES(2,'feature/log-follow','83f73f16dbf4a8b2b0c4312d20203626f3fe39c0');
INSERT INTO "branches" VALUES(2,'fix/timeouts','74e69a5d0dd27a65bd628881ad1b72dba7abe1c2');
INSERT INTO "branches" VALUES(3,'main','20859634fe3c9c8f2b855c1f28aaca51b98c67c2');
INSERT INTO "branches" VALUES(3,'feature/checkout-v2','77216e9ee7a46309973f798626b1cffc070d7109');
INSERT INTO "branches" VALUES(3,'feature/dark-mode','d39630d69c9011ef256badf9a7e6529bce76e9f4');
INSERT INTO "branches" VALUES(3,'feature/cart-badge','effddeeaa842bc19796f74adfaf55496988af3fb');
INSERT INTO "branches" VALUES(3,'fix/ci-cache','057a40b22188287e8c5c715f8c74fc1e27e9e06f');
INSERT INTO "branches" VALUES(4,'main','c17a9262453bf4912e7a26e9c76c603fe7e8f9f6');
INSERT INTO "branches" VALUES(4,'feature/simd-decode','e9526a69d97e967b6c18d982d1dcec53212a8d9b');
INSERT INTO "branches" VALUES(4,'feature/no-std','67ec326a42343354f22d2882d1a89b37ad0c9bb6');
INSERT INTO "branches" VALUES(4,'fix/flaky-test','7e9ee51d9212824c83c8cb28eb4ed2e3895e8b6b');
INSERT INTO "branches" VALUES(5,'main','95e8c93e15a0a8ae3b996870a1320b9d4de2f8ad');
INSERT INTO "branches" VALUES(5,'feature/rds-upgrade','27be9ab1c0236e49da6e6d8e8778f742f527b5c2');
INSERT INTO "branches" VALUES(5,'feature/alb-waf','e10c167dc8b6eaffb74b589be48e9e02a854c834');
INSERT INTO "branches" VALUES(5,'fix/timeouts','fc173498b87e4e2b537d9128c3a9e88963b759f5');
CREATE TABLE log_lines (
    run_id    INTEGER NOT NULL,
    action_id INTEGER NOT NULL,
    line_no   INTEGER NOT NULL,
    text      TEXT NOT NULL,
    PRIMARY KEY (run_id, action_id, line_no)
) WITHOUT ROWID;
INSERT INTO "log_lines" VALUES(1,0,1,'2026-11-02T03:01:35Z Run #1 of ci (version 1) queued by anna.schmidt via pull_request');
INSERT INTO "log_lines" VALUES(1,0,2,'2026-11-02T03:01:35Z Repository fastcodec @ fix/flaky-test (64950dc210a2)');
INSERT INTO "log_lines" VALUES(1,0,3,'2026-11-02T03:02:52Z Picked up by runner knecht-runner-04');
INSERT INTO "log_lines" VALUES(1,0,4,'2026-11-02T03:02:52Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(1,0,5,'2026-11-02T03:02:52Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(1,0,6,'2026-11-02T03:02:53Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(1,0,7,'2026-11-02T03:02:55Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(1,0,8,'2026-11-02T03:03:03Z ✔ checkout succeeded in 8s');
INSERT INTO "log_lines" VALUES(1,0,9,'2026-11-02T03:03:05Z ▶ install started');
INSERT INTO "log_lines" VALUES(1,0,10,'2026-11-02T03:03:31Z ✔ install succeeded in 26s');
INSERT INTO "log_lines" VALUES(1,0,11,'2026-11-02T03:03:31Z ▶ lint started');
INSERT INTO "log_lines" VALUES(1,0,12,'2026-11-02T03:03:57Z ✔ lint succeeded in 26s');
INSERT INTO "log_lines" VALUES(1,0,13,'2026-11-02T03:03:58Z ▶ build started');
INSERT INTO "log_lines" VALUES(1,0,14,'2026-11-02T03:05:41Z ✔ build succeeded in 103s');
INSERT INTO "log_lines" VALUES(1,0,15,'2026-11-02T03:05:44Z ▶ test started');
INSERT INTO "log_lines" VALUES(1,0,16,'2026-11-02T03:15:27Z ✔ test succeeded in 583s');
INSERT INTO "log_lines" VALUES(1,0,17,'2026-11-02T03:15:29Z Run succeeded');
INSERT INTO "log_lines" VALUES(1,1,1,'Reading .knecht/workflows/ci.yml at 64950dc');
INSERT INTO "log_lines" VALUES(1,1,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(1,2,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(1,2,2,'HEAD is now at 64950dc on fix/flaky-test');
INSERT INTO "log_lines" VALUES(1,3,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(1,3,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(1,3,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(1,4,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(1,4,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(1,5,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(1,5,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(1,5,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(1,5,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(1,6,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(1,6,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(1,6,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(2,0,1,'2026-11-03T15:50:04Z Run #2 of ci (version 1) queued by sara.okafor via push');
INSERT INTO "log_lines" VALUES(2,0,2,'2026-11-03T15:50:04Z Repository fastcodec @ feature/no-std (bb7b738eeef7)');
INSERT INTO "log_lines" VALUES(2,0,3,'2026-11-03T15:51:24Z Picked up by runner knecht-runner-05');
INSERT INTO "log_lines" VALUES(2,0,4,'2026-11-03T15:51:24Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(2,0,5,'2026-11-03T15:51:24Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(2,0,6,'2026-11-03T15:51:25Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(2,0,7,'2026-11-03T15:51:27Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(2,0,8,'2026-11-03T15:51:36Z ✔ checkout succeeded in 9s');
INSERT INTO "log_lines" VALUES(2,0,9,'2026-11-03T15:51:36Z ▶ install started');
INSERT INTO "log_lines" VALUES(2,0,10,'2026-11-03T15:53:06Z ✔ install succeeded in 90s');
INSERT INTO "log_lines" VALUES(2,0,11,'2026-11-03T15:53:09Z ▶ lint started');
INSERT INTO "log_lines" VALUES(2,0,12,'2026-11-03T15:53:43Z ✔ lint succeeded in 34s');
INSERT INTO "log_lines" VALUES(2,0,13,'2026-11-03T15:53:45Z ▶ build started');
INSERT INTO "log_lines" VALUES(2,0,14,'2026-11-03T15:55:37Z ✔ build succeeded in 112s');
INSERT INTO "log_lines" VALUES(2,0,15,'2026-11-03T15:55:39Z ▶ test started');
INSERT INTO "log_lines" VALUES(2,0,16,'2026-11-03T16:03:34Z ✔ test succeeded in 475s');
INSERT INTO "log_lines" VALUES(2,0,17,'2026-11-03T16:03:35Z Run succeeded');
INSERT INTO "log_lines" VALUES(2,7,1,'Reading .knecht/workflows/ci.yml at bb7b738');
INSERT INTO "log_lines" VALUES(2,7,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(2,8,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(2,8,2,'HEAD is now at bb7b738 on feature/no-std');
INSERT INTO "log_lines" VALUES(2,9,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(2,9,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(2,9,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(2,10,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(2,10,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(2,11,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(2,11,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(2,11,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(2,11,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(2,12,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(2,12,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(2,12,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(3,0,1,'2026-11-04T17:23:40Z Run #1 of ci (version 1) queued by jonas.weber via pull_request');
INSERT INTO "log_lines" VALUES(3,0,2,'2026-11-04T17:23:40Z Repository storefront-web @ feature/checkout-v2 (73f6e53d3853)');
INSERT INTO "log_lines" VALUES(3,0,3,'2026-11-04T17:24:39Z Picked up by runner knecht-runner-07');
INSERT INTO "log_lines" VALUES(3,0,4,'2026-11-04T17:24:39Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(3,0,5,'2026-11-04T17:24:39Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(3,0,6,'2026-11-04T17:24:41Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(3,0,7,'2026-11-04T17:24:42Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(3,0,8,'2026-11-04T17:24:47Z ✔ checkout succeeded in 5s');
INSERT INTO "log_lines" VALUES(3,0,9,'2026-11-04T17:24:48Z ▶ install started');
INSERT INTO "log_lines" VALUES(3,0,10,'2026-11-04T17:25:19Z ✔ install succeeded in 31s');
INSERT INTO "log_lines" VALUES(3,0,11,'2026-11-04T17:25:19Z ▶ lint started');
INSERT INTO "log_lines" VALUES(3,0,12,'2026-11-04T17:25:47Z ✔ lint succeeded in 28s');
INSERT INTO "log_lines" VALUES(3,0,13,'2026-11-04T17:25:48Z ▶ build started');
INSERT INTO "log_lines" VALUES(3,0,14,'2026-11-04T17:28:02Z ✔ build succeeded in 134s');
INSERT INTO "log_lines" VALUES(3,0,15,'2026-11-04T17:28:03Z ▶ test started');
INSERT INTO "log_lines" VALUES(3,0,16,'2026-11-04T17:29:23Z ✔ test succeeded in 80s');
INSERT INTO "log_lines" VALUES(3,0,17,'2026-11-04T17:29:26Z Run succeeded');
INSERT INTO "log_lines" VALUES(3,13,1,'Reading .knecht/workflows/ci.yml at 73f6e53');
INSERT INTO "log_lines" VALUES(3,13,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(3,14,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(3,14,2,'HEAD is now at 73f6e53 on feature/checkout-v2');
INSERT INTO "log_lines" VALUES(3,15,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(3,15,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(3,15,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(3,15,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(3,16,1,'$ npm run lint && npm run typecheck');
INSERT INTO "log_lines" VALUES(3,16,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(3,17,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(3,17,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(3,17,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(3,17,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(3,17,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(3,18,1,'$ npm test -- --ci --reporters=default');
INSERT INTO "log_lines" VALUES(3,18,2,'PASS src/cart/Cart.test.tsx');
INSERT INTO "log_lines" VALUES(3,18,3,'PASS src/checkout/Checkout.test.tsx');
INSERT INTO "log_lines" VALUES(3,18,4,'Test Suites: 58 passed, 58 total');
INSERT INTO "log_lines" VALUES(3,18,5,'Tests:       412 passed, 412 total');
INSERT INTO "log_lines" VALUES(4,0,1,'2026-11-06T02:53:59Z Run #2 of ci (version 1) queued by mei.chen via push');
INSERT INTO "log_lines" VALUES(4,0,2,'2026-11-06T02:53:59Z Repository storefront-web @ main (877b55cb80de)');
INSERT INTO "log_lines" VALUES(4,0,3,'2026-11-06T02:54:28Z Picked up by runner knecht-runner-02');
INSERT INTO "log_lines" VALUES(4,0,4,'2026-11-06T02:54:28Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(4,0,5,'2026-11-06T02:54:28Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(4,0,6,'2026-11-06T02:54:29Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(4,0,7,'2026-11-06T02:54:31Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(4,0,8,'2026-11-06T02:54:36Z ✔ checkout succeeded in 5s');
INSERT INTO "log_lines" VALUES(4,0,9,'2026-11-06T02:54:39Z ▶ install started');
INSERT INTO "log_lines" VALUES(4,0,10,'2026-11-06T02:55:50Z ✔ install succeeded in 71s');
INSERT INTO "log_lines" VALUES(4,0,11,'2026-11-06T02:55:53Z ▶ lint started');
INSERT INTO "log_lines" VALUES(4,0,12,'2026-11-06T02:56:20Z ✔ lint succeeded in 27s');
INSERT INTO "log_lines" VALUES(4,0,13,'2026-11-06T02:56:20Z ▶ build started');
INSERT INTO "log_lines" VALUES(4,0,14,'2026-11-06T02:57:32Z ✔ build succeeded in 72s');
INSERT INTO "log_lines" VALUES(4,0,15,'2026-11-06T02:57:35Z ▶ test started');
INSERT INTO "log_lines" VALUES(4,0,16,'2026-11-06T03:06:56Z ✔ test succeeded in 561s');
INSERT INTO "log_lines" VALUES(4,0,17,'2026-11-06T03:06:56Z Run succeeded');
INSERT INTO "log_lines" VALUES(4,19,1,'Reading .knecht/workflows/ci.yml at 877b55c');
INSERT INTO "log_lines" VALUES(4,19,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(4,20,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(4,20,2,'HEAD is now at 877b55c on main');
INSERT INTO "log_lines" VALUES(4,21,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(4,21,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(4,21,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(4,21,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(4,22,1,'$ npm run lint && npm run typecheck');
INSERT INTO "log_lines" VALUES(4,22,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(4,23,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(4,23,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(4,23,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(4,23,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(4,23,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(4,23,6,'Connecting to postgres://storefront_web:FkQ1okTBGzvAmwufUx@db.internal:5432/storefront_web for migrations check… ok');
INSERT INTO "log_lines" VALUES(4,24,1,'$ npm test -- --ci --reporters=default');
INSERT INTO "log_lines" VALUES(4,24,2,'PASS src/cart/Cart.test.tsx');
INSERT INTO "log_lines" VALUES(4,24,3,'PASS src/checkout/Checkout.test.tsx');
INSERT INTO "log_lines" VALUES(4,24,4,'Test Suites: 58 passed, 58 total');
INSERT INTO "log_lines" VALUES(4,24,5,'Tests:       412 passed, 412 total');
INSERT INTO "log_lines" VALUES(5,0,1,'2026-11-07T14:05:41Z Run #1 of release (version 1) queued by lukas.bauer via push');
INSERT INTO "log_lines" VALUES(5,0,2,'2026-11-07T14:05:41Z Repository infra-live @ main (85b9c09a26ed)');
INSERT INTO "log_lines" VALUES(5,0,3,'2026-11-07T14:07:05Z Picked up by runner knecht-runner-07');
INSERT INTO "log_lines" VALUES(5,0,4,'2026-11-07T14:07:05Z Inputs: {"dry_run": false, "environment": "production", "version": "v1.0.1"}');
INSERT INTO "log_lines" VALUES(5,0,5,'2026-11-07T14:07:05Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(5,0,6,'2026-11-07T14:07:07Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(5,0,7,'2026-11-07T14:07:07Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(5,0,8,'2026-11-07T14:07:09Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(5,0,9,'2026-11-07T14:07:09Z ▶ install started');
INSERT INTO "log_lines" VALUES(5,0,10,'2026-11-07T14:07:45Z ✔ install succeeded in 36s');
INSERT INTO "log_lines" VALUES(5,0,11,'2026-11-07T14:07:45Z ▶ build started');
INSERT INTO "log_lines" VALUES(5,0,12,'2026-11-07T14:11:10Z ✔ build succeeded in 205s');
INSERT INTO "log_lines" VALUES(5,0,13,'2026-11-07T14:11:11Z ▶ test started');
INSERT INTO "log_lines" VALUES(5,0,14,'2026-11-07T14:16:28Z ✔ test succeeded in 317s');
INSERT INTO "log_lines" VALUES(5,0,15,'2026-11-07T14:16:31Z ▶ publish started');
INSERT INTO "log_lines" VALUES(5,0,16,'2026-11-07T14:16:48Z ✔ publish succeeded in 17s');
INSERT INTO "log_lines" VALUES(5,0,17,'2026-11-07T14:16:48Z ▶ deploy started');
INSERT INTO "log_lines" VALUES(5,0,18,'2026-11-07T14:17:51Z ✔ deploy succeeded in 63s');
INSERT INTO "log_lines" VALUES(5,0,19,'2026-11-07T14:17:52Z Run succeeded');
INSERT INTO "log_lines" VALUES(5,25,1,'Reading .knecht/workflows/release.yml at 85b9c09');
INSERT INTO "log_lines" VALUES(5,25,2,'Workflow release: 6 actions, inputs validated');
INSERT INTO "log_lines" VALUES(5,26,1,'$ git clone --depth 1 https://git.acme.internal/acme/infra-live.git .');
INSERT INTO "log_lines" VALUES(5,26,2,'HEAD is now at 85b9c09 on main');
INSERT INTO "log_lines" VALUES(5,27,1,'$ terraform init -input=false');
INSERT INTO "log_lines" VALUES(5,27,2,'Initializing the backend...');
INSERT INTO "log_lines" VALUES(5,27,3,'Initializing provider plugins...');
INSERT INTO "log_lines" VALUES(5,27,4,'- Installing hashicorp/aws v5.74.0...');
INSERT INTO "log_lines" VALUES(5,27,5,'Terraform has been successfully initialized!');
INSERT INTO "log_lines" VALUES(5,28,1,'$ terraform plan -out=plan.tfplan');
INSERT INTO "log_lines" VALUES(5,28,2,'Refreshing state... [id=vpc-0a1b2c3d]');
INSERT INTO "log_lines" VALUES(5,28,3,'Plan: 3 to add, 1 to change, 0 to destroy.');
INSERT INTO "log_lines" VALUES(5,29,1,'$ go test ./test/... -timeout 30m');
INSERT INTO "log_lines" VALUES(5,29,2,'--- PASS: TestVpcModule (84.20s)');
INSERT INTO "log_lines" VALUES(5,29,3,'ok  	github.com/acme/infra-live/test	91.112s');
INSERT INTO "log_lines" VALUES(5,30,1,'$ knecht artifacts upload dist/');
INSERT INTO "log_lines" VALUES(5,30,2,'Uploaded 3 artifacts to acme-infra-live-artifacts');
INSERT INTO "log_lines" VALUES(5,31,1,'$ terraform apply -auto-approve plan.tfplan');
INSERT INTO "log_lines" VALUES(5,31,2,'Deployed infra-live 85b9c09 successfully');
INSERT INTO "log_lines" VALUES(6,0,1,'2026-11-08T21:23:30Z Run #3 of ci (version 1) queued by mei.chen via push');
INSERT INTO "log_lines" VALUES(6,0,2,'2026-11-08T21:23:30Z Repository fastcodec @ feature/no-std (3c19c31586ba)');
INSERT INTO "log_lines" VALUES(6,0,3,'2026-11-08T21:23:35Z Picked up by runner knecht-runner-01');
INSERT INTO "log_lines" VALUES(6,0,4,'2026-11-08T21:23:35Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(6,0,5,'2026-11-08T21:23:35Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(6,0,6,'2026-11-08T21:23:37Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(6,0,7,'2026-11-08T21:23:39Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(6,0,8,'2026-11-08T21:23:41Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(6,0,9,'2026-11-08T21:23:41Z ▶ install started');
INSERT INTO "log_lines" VALUES(6,0,10,'2026-11-08T21:24:25Z ✔ install succeeded in 44s');
INSERT INTO "log_lines" VALUES(6,0,11,'2026-11-08T21:24:28Z ▶ lint started');
INSERT INTO "log_lines" VALUES(6,0,12,'2026-11-08T21:24:41Z ✔ lint succeeded in 13s');
INSERT INTO "log_lines" VALUES(6,0,13,'2026-11-08T21:24:43Z ▶ build started');
INSERT INTO "log_lines" VALUES(6,0,14,'2026-11-08T21:26:21Z ✔ build succeeded in 98s');
INSERT INTO "log_lines" VALUES(6,0,15,'2026-11-08T21:26:23Z ▶ test started');
INSERT INTO "log_lines" VALUES(6,0,16,'2026-11-08T21:31:15Z ✔ test succeeded in 292s');
INSERT INTO "log_lines" VALUES(6,0,17,'2026-11-08T21:31:18Z Run succeeded');
INSERT INTO "log_lines" VALUES(6,32,1,'Reading .knecht/workflows/ci.yml at 3c19c31');
INSERT INTO "log_lines" VALUES(6,32,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(6,33,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(6,33,2,'HEAD is now at 3c19c31 on feature/no-std');
INSERT INTO "log_lines" VALUES(6,34,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(6,34,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(6,34,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(6,35,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(6,35,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(6,36,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(6,36,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(6,36,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(6,36,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(6,37,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(6,37,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(6,37,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(7,0,1,'2026-11-11T01:02:58Z Run #3 of ci (version 1) queued by mei.chen via push');
INSERT INTO "log_lines" VALUES(7,0,2,'2026-11-11T01:02:58Z Repository storefront-web @ main (f848a9567ee5)');
INSERT INTO "log_lines" VALUES(7,0,3,'2026-11-11T01:03:24Z Picked up by runner knecht-runner-03');
INSERT INTO "log_lines" VALUES(7,0,4,'2026-11-11T01:03:24Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(7,0,5,'2026-11-11T01:03:24Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(7,0,6,'2026-11-11T01:03:26Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(7,0,7,'2026-11-11T01:03:27Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(7,0,8,'2026-11-11T01:03:33Z ✔ checkout succeeded in 6s');
INSERT INTO "log_lines" VALUES(7,0,9,'2026-11-11T01:03:35Z ▶ install started');
INSERT INTO "log_lines" VALUES(7,0,10,'2026-11-11T01:04:08Z ✖ install cancelled in 33s');
INSERT INTO "log_lines" VALUES(7,0,11,'2026-11-11T01:04:11Z Run cancelled by sara.okafor; remaining actions skipped');
INSERT INTO "log_lines" VALUES(7,38,1,'Reading .knecht/workflows/ci.yml at f848a95');
INSERT INTO "log_lines" VALUES(7,38,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(7,39,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(7,39,2,'HEAD is now at f848a95 on main');
INSERT INTO "log_lines" VALUES(7,40,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(7,40,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(7,40,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(7,40,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(8,0,1,'2026-11-12T20:16:23Z Run #1 of nightly (version 1) queued by knecht-scheduler via schedule');
INSERT INTO "log_lines" VALUES(8,0,2,'2026-11-12T20:16:23Z Repository storefront-web @ main (20859634fe3c)');
INSERT INTO "log_lines" VALUES(8,0,3,'2026-11-12T20:17:15Z Picked up by runner knecht-runner-04');
INSERT INTO "log_lines" VALUES(8,0,4,'2026-11-12T20:17:15Z Inputs: {"suite": "full"}');
INSERT INTO "log_lines" VALUES(8,0,5,'2026-11-12T20:17:15Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(8,0,6,'2026-11-12T20:17:16Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(8,0,7,'2026-11-12T20:17:17Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(8,0,8,'2026-11-12T20:17:19Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(8,0,9,'2026-11-12T20:17:20Z ▶ install started');
INSERT INTO "log_lines" VALUES(8,0,10,'2026-11-12T20:18:33Z ✔ install succeeded in 73s');
INSERT INTO "log_lines" VALUES(8,0,11,'2026-11-12T20:18:33Z ▶ build started');
INSERT INTO "log_lines" VALUES(8,0,12,'2026-11-12T20:20:00Z ✔ build succeeded in 87s');
INSERT INTO "log_lines" VALUES(8,0,13,'2026-11-12T20:20:02Z ▶ test started');
INSERT INTO "log_lines" VALUES(8,0,14,'2026-11-12T20:22:57Z ✔ test succeeded in 175s');
INSERT INTO "log_lines" VALUES(8,0,15,'2026-11-12T20:22:57Z ▶ report started');
INSERT INTO "log_lines" VALUES(8,0,16,'2026-11-12T20:23:02Z ✔ report succeeded in 5s');
INSERT INTO "log_lines" VALUES(8,0,17,'2026-11-12T20:23:04Z Run succeeded');
INSERT INTO "log_lines" VALUES(8,44,1,'Reading .knecht/workflows/nightly.yml at 2085963');
INSERT INTO "log_lines" VALUES(8,44,2,'Workflow nightly: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(8,45,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(8,45,2,'HEAD is now at 2085963 on main');
INSERT INTO "log_lines" VALUES(8,46,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(8,46,2,'+ echo AWS_ACCESS_KEY_ID=AKIAAG7I1MNBQNS6PUQ8');
INSERT INTO "log_lines" VALUES(8,46,3,'AWS_ACCESS_KEY_ID=AKIAAG7I1MNBQNS6PUQ8');
INSERT INTO "log_lines" VALUES(8,46,4,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(8,46,5,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(8,46,6,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(8,47,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(8,47,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(8,47,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(8,47,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(8,47,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(8,48,1,'$ npm test -- --ci --reporters=default');
INSERT INTO "log_lines" VALUES(8,48,2,'PASS src/cart/Cart.test.tsx');
INSERT INTO "log_lines" VALUES(8,48,3,'PASS src/checkout/Checkout.test.tsx');
INSERT INTO "log_lines" VALUES(8,48,4,'Test Suites: 58 passed, 58 total');
INSERT INTO "log_lines" VALUES(8,48,5,'Tests:       412 passed, 412 total');
INSERT INTO "log_lines" VALUES(8,49,1,'$ knecht report --format junit results/*.xml');
INSERT INTO "log_lines" VALUES(8,49,2,'Report uploaded: 1 file');
INSERT INTO "log_lines" VALUES(9,0,1,'2026-11-13T06:40:42Z Run #1 of ci (version 1) queued by mei.chen via push');
INSERT INTO "log_lines" VALUES(9,0,2,'2026-11-13T06:40:42Z Repository infra-live @ feature/alb-waf (1407ab3300bc)');
INSERT INTO "log_lines" VALUES(9,0,3,'2026-11-13T06:41:28Z Picked up by runner knecht-runner-04');
INSERT INTO "log_lines" VALUES(9,0,4,'2026-11-13T06:41:28Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(9,0,5,'2026-11-13T06:41:28Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(9,0,6,'2026-11-13T06:41:30Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(9,0,7,'2026-11-13T06:41:30Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(9,0,8,'2026-11-13T06:41:35Z ✔ checkout succeeded in 5s');
INSERT INTO "log_lines" VALUES(9,0,9,'2026-11-13T06:41:38Z ▶ install started');
INSERT INTO "log_lines" VALUES(9,0,10,'2026-11-13T06:42:43Z ✔ install succeeded in 65s');
INSERT INTO "log_lines" VALUES(9,0,11,'2026-11-13T06:42:45Z ▶ lint started');
INSERT INTO "log_lines" VALUES(9,0,12,'2026-11-13T06:43:20Z ✔ lint succeeded in 35s');
INSERT INTO "log_lines" VALUES(9,0,13,'2026-11-13T06:43:20Z ▶ build started');
INSERT INTO "log_lines" VALUES(9,0,14,'2026-11-13T06:44:12Z ✔ build succeeded in 52s');
INSERT INTO "log_lines" VALUES(9,0,15,'2026-11-13T06:44:13Z ▶ test started');
INSERT INTO "log_lines" VALUES(9,0,16,'2026-11-13T06:51:34Z ✔ test succeeded in 441s');
INSERT INTO "log_lines" VALUES(9,0,17,'2026-11-13T06:51:37Z Run succeeded');
INSERT INTO "log_lines" VALUES(9,50,1,'Reading .knecht/workflows/ci.yml at 1407ab3');
INSERT INTO "log_lines" VALUES(9,50,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(9,51,1,'$ git clone --depth 1 https://git.acme.internal/acme/infra-live.git .');
INSERT INTO "log_lines" VALUES(9,51,2,'HEAD is now at 1407ab3 on feature/alb-waf');
INSERT INTO "log_lines" VALUES(9,52,1,'$ terraform init -input=false');
INSERT INTO "log_lines" VALUES(9,52,2,'Initializing the backend...');
INSERT INTO "log_lines" VALUES(9,52,3,'Initializing provider plugins...');
INSERT INTO "log_lines" VALUES(9,52,4,'- Installing hashicorp/aws v5.74.0...');
INSERT INTO "log_lines" VALUES(9,52,5,'Terraform has been successfully initialized!');
INSERT INTO "log_lines" VALUES(9,53,1,'$ terraform fmt -check -recursive && tflint');
INSERT INTO "log_lines" VALUES(9,53,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(9,54,1,'$ terraform plan -out=plan.tfplan');
INSERT INTO "log_lines" VALUES(9,54,2,'Refreshing state... [id=vpc-0a1b2c3d]');
INSERT INTO "log_lines" VALUES(9,54,3,'Plan: 3 to add, 1 to change, 0 to destroy.');
INSERT INTO "log_lines" VALUES(9,55,1,'$ go test ./test/... -timeout 30m');
INSERT INTO "log_lines" VALUES(9,55,2,'--- PASS: TestVpcModule (84.20s)');
INSERT INTO "log_lines" VALUES(9,55,3,'ok  	github.com/acme/infra-live/test	91.112s');
INSERT INTO "log_lines" VALUES(10,0,1,'2026-11-14T23:38:20Z Run #4 of ci (version 1) queued by tom.nguyen via pull_request');
INSERT INTO "log_lines" VALUES(10,0,2,'2026-11-14T23:38:20Z Repository fastcodec @ feature/simd-decode (10053d2c76cc)');
INSERT INTO "log_lines" VALUES(10,0,3,'2026-11-14T23:38:29Z Picked up by runner knecht-runner-02');
INSERT INTO "log_lines" VALUES(10,0,4,'2026-11-14T23:38:29Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(10,0,5,'2026-11-14T23:38:29Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(10,0,6,'2026-11-14T23:38:31Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(10,0,7,'2026-11-14T23:38:32Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(10,0,8,'2026-11-14T23:38:35Z ✔ checkout succeeded in 3s');
INSERT INTO "log_lines" VALUES(10,0,9,'2026-11-14T23:38:37Z ▶ install started');
INSERT INTO "log_lines" VALUES(10,0,10,'2026-11-14T23:39:43Z ✔ install succeeded in 66s');
INSERT INTO "log_lines" VALUES(10,0,11,'2026-11-14T23:39:43Z ▶ lint started');
INSERT INTO "log_lines" VALUES(10,0,12,'2026-11-14T23:40:07Z ✔ lint succeeded in 24s');
INSERT INTO "log_lines" VALUES(10,0,13,'2026-11-14T23:40:09Z ▶ build started');
INSERT INTO "log_lines" VALUES(10,0,14,'2026-11-14T23:41:59Z ✔ build succeeded in 110s');
INSERT INTO "log_lines" VALUES(10,0,15,'2026-11-14T23:41:59Z ▶ test started');
INSERT INTO "log_lines" VALUES(10,0,16,'2026-11-14T23:43:23Z ✔ test succeeded in 84s');
INSERT INTO "log_lines" VALUES(10,0,17,'2026-11-14T23:43:24Z Run succeeded');
INSERT INTO "log_lines" VALUES(10,56,1,'Reading .knecht/workflows/ci.yml at 10053d2');
INSERT INTO "log_lines" VALUES(10,56,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(10,57,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(10,57,2,'HEAD is now at 10053d2 on feature/simd-decode');
INSERT INTO "log_lines" VALUES(10,58,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(10,58,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(10,58,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(10,59,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(10,59,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(10,60,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(10,60,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(10,60,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(10,60,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(10,61,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(10,61,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(10,61,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(11,0,1,'2026-11-16T17:06:24Z Run #1 of nightly (version 2) queued by knecht-scheduler via schedule');
INSERT INTO "log_lines" VALUES(11,0,2,'2026-11-16T17:06:24Z Repository infra-live @ main (7e544d56d096)');
INSERT INTO "log_lines" VALUES(11,0,3,'2026-11-16T17:07:29Z Picked up by runner knecht-runner-04');
INSERT INTO "log_lines" VALUES(11,0,4,'2026-11-16T17:07:29Z Inputs: {"suite": "full"}');
INSERT INTO "log_lines" VALUES(11,0,5,'2026-11-16T17:07:29Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(11,0,6,'2026-11-16T17:07:30Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(11,0,7,'2026-11-16T17:07:30Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(11,0,8,'2026-11-16T17:07:36Z ✔ checkout succeeded in 6s');
INSERT INTO "log_lines" VALUES(11,0,9,'2026-11-16T17:07:37Z ▶ install started');
INSERT INTO "log_lines" VALUES(11,0,10,'2026-11-16T17:08:27Z ✔ install succeeded in 50s');
INSERT INTO "log_lines" VALUES(11,0,11,'2026-11-16T17:08:29Z ▶ build started');
INSERT INTO "log_lines" VALUES(11,0,12,'2026-11-16T17:11:06Z ✔ build succeeded in 157s');
INSERT INTO "log_lines" VALUES(11,0,13,'2026-11-16T17:11:06Z ▶ test started');
INSERT INTO "log_lines" VALUES(11,0,14,'2026-11-16T17:20:50Z ✖ test failed in 584s (exit code 1)');
INSERT INTO "log_lines" VALUES(11,0,15,'2026-11-16T17:20:51Z Run failed: action ''test'' failed; remaining actions skipped');
INSERT INTO "log_lines" VALUES(11,62,1,'Reading .knecht/workflows/nightly.yml at 7e544d5');
INSERT INTO "log_lines" VALUES(11,62,2,'Workflow nightly: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(11,63,1,'$ git clone --depth 1 https://git.acme.internal/acme/infra-live.git .');
INSERT INTO "log_lines" VALUES(11,63,2,'HEAD is now at 7e544d5 on main');
INSERT INTO "log_lines" VALUES(11,64,1,'$ terraform init -input=false');
INSERT INTO "log_lines" VALUES(11,64,2,'Initializing the backend...');
INSERT INTO "log_lines" VALUES(11,64,3,'Initializing provider plugins...');
INSERT INTO "log_lines" VALUES(11,64,4,'- Installing hashicorp/aws v5.74.0...');
INSERT INTO "log_lines" VALUES(11,64,5,'Terraform has been successfully initialized!');
INSERT INTO "log_lines" VALUES(11,65,1,'$ terraform plan -out=plan.tfplan');
INSERT INTO "log_lines" VALUES(11,65,2,'Refreshing state... [id=vpc-0a1b2c3d]');
INSERT INTO "log_lines" VALUES(11,65,3,'Plan: 3 to add, 1 to change, 0 to destroy.');
INSERT INTO "log_lines" VALUES(11,66,1,'$ go test ./test/... -timeout 30m');
INSERT INTO "log_lines" VALUES(11,66,2,'DEBUG db config: password=7neLfjVHq8xiM0OGr4 host=db.internal');
INSERT INTO "log_lines" VALUES(11,66,3,'--- FAIL: TestAlbHealthCheck (132.51s)');
INSERT INTO "log_lines" VALUES(11,66,4,'    alb_test.go:41: health check https://staging.internal/healthz: got 500, want 200');
INSERT INTO "log_lines" VALUES(11,66,5,'    alb_test.go:42: assert 200 == 500');
INSERT INTO "log_lines" VALUES(11,66,6,'FAIL	github.com/acme/infra-live/test	140.022s');
INSERT INTO "log_lines" VALUES(12,0,1,'2026-11-18T02:40:45Z Run #4 of ci (version 1) queued by lukas.bauer via push');
INSERT INTO "log_lines" VALUES(12,0,2,'2026-11-18T02:40:45Z Repository storefront-web @ main (15866ffb9fe5)');
INSERT INTO "log_lines" VALUES(12,0,3,'2026-11-18T02:41:40Z Picked up by runner knecht-runner-05');
INSERT INTO "log_lines" VALUES(12,0,4,'2026-11-18T02:41:40Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(12,0,5,'2026-11-18T02:41:40Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(12,0,6,'2026-11-18T02:41:42Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(12,0,7,'2026-11-18T02:41:43Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(12,0,8,'2026-11-18T02:41:48Z ✔ checkout succeeded in 5s');
INSERT INTO "log_lines" VALUES(12,0,9,'2026-11-18T02:41:49Z ▶ install started');
INSERT INTO "log_lines" VALUES(12,0,10,'2026-11-18T02:43:02Z ✔ install succeeded in 73s');
INSERT INTO "log_lines" VALUES(12,0,11,'2026-11-18T02:43:03Z ▶ lint started');
INSERT INTO "log_lines" VALUES(12,0,12,'2026-11-18T02:43:18Z ✔ lint succeeded in 15s');
INSERT INTO "log_lines" VALUES(12,0,13,'2026-11-18T02:43:20Z ▶ build started');
INSERT INTO "log_lines" VALUES(12,0,14,'2026-11-18T02:45:15Z ✖ build cancelled in 115s');
INSERT INTO "log_lines" VALUES(12,0,15,'2026-11-18T02:45:17Z Run cancelled by mei.chen; remaining actions skipped');
INSERT INTO "log_lines" VALUES(12,68,1,'Reading .knecht/workflows/ci.yml at 15866ff');
INSERT INTO "log_lines" VALUES(12,68,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(12,69,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(12,69,2,'HEAD is now at 15866ff on main');
INSERT INTO "log_lines" VALUES(12,70,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(12,70,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(12,70,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(12,70,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(12,71,1,'$ npm run lint && npm run typecheck');
INSERT INTO "log_lines" VALUES(12,71,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(12,72,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(12,72,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(12,72,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(12,72,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(12,72,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(13,0,1,'2026-11-20T02:34:13Z Run #1 of ci (version 2) queued by sara.okafor via push');
INSERT INTO "log_lines" VALUES(13,0,2,'2026-11-20T02:34:13Z Repository payments-api @ main (a6a3a4506513)');
INSERT INTO "log_lines" VALUES(13,0,3,'2026-11-20T02:34:47Z Picked up by runner knecht-runner-04');
INSERT INTO "log_lines" VALUES(13,0,4,'2026-11-20T02:34:47Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(13,0,5,'2026-11-20T02:34:47Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(13,0,6,'2026-11-20T02:34:48Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(13,0,7,'2026-11-20T02:34:49Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(13,0,8,'2026-11-20T02:34:52Z ✔ checkout succeeded in 3s');
INSERT INTO "log_lines" VALUES(13,0,9,'2026-11-20T02:34:55Z ▶ install started');
INSERT INTO "log_lines" VALUES(13,0,10,'2026-11-20T02:35:19Z ✖ install failed in 24s (exit code 1)');
INSERT INTO "log_lines" VALUES(13,0,11,'2026-11-20T02:35:22Z Run failed: action ''install'' failed; remaining actions skipped');
INSERT INTO "log_lines" VALUES(13,74,1,'Reading .knecht/workflows/ci.yml at a6a3a45');
INSERT INTO "log_lines" VALUES(13,74,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(13,75,1,'$ git clone --depth 1 https://git.acme.internal/acme/payments-api.git .');
INSERT INTO "log_lines" VALUES(13,75,2,'HEAD is now at a6a3a45 on main');
INSERT INTO "log_lines" VALUES(13,76,1,'$ pip install -r requirements.txt -r requirements-dev.txt');
INSERT INTO "log_lines" VALUES(13,76,2,'Collecting fastapi==0.115.4');
INSERT INTO "log_lines" VALUES(13,76,3,'Collecting pydantic<2');
INSERT INTO "log_lines" VALUES(13,76,4,'INFO: pip is looking at multiple versions of fastapi to determine which version is compatible.');
INSERT INTO "log_lines" VALUES(13,76,5,'ERROR: Cannot install -r requirements.txt (line 3) and pydantic<2 because these package versions have conflicting dependencies.');
INSERT INTO "log_lines" VALUES(13,76,6,'');
INSERT INTO "log_lines" VALUES(13,76,7,'The conflict is caused by:');
INSERT INTO "log_lines" VALUES(13,76,8,'    The user requested pydantic<2');
INSERT INTO "log_lines" VALUES(13,76,9,'    fastapi 0.115.4 depends on pydantic!=1.8, !=2.0.0, !=2.1.0, <3.0.0 and >=1.7.4');
INSERT INTO "log_lines" VALUES(13,76,10,'    sqlmodel 0.0.22 depends on pydantic>=2.0');
INSERT INTO "log_lines" VALUES(13,76,11,'');
INSERT INTO "log_lines" VALUES(13,76,12,'ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts');
INSERT INTO "log_lines" VALUES(13,76,13,'Error: ''pip install -r requirements.txt -r requirements-dev.txt'' exited with code 1');
INSERT INTO "log_lines" VALUES(14,0,1,'2026-11-21T18:15:36Z Run #2 of ci (version 2) queued by jonas.weber via push');
INSERT INTO "log_lines" VALUES(14,0,2,'2026-11-21T18:15:36Z Repository infra-live @ main (133ad73dee1f)');
INSERT INTO "log_lines" VALUES(14,0,3,'2026-11-21T18:16:00Z Picked up by runner knecht-runner-01');
INSERT INTO "log_lines" VALUES(14,0,4,'2026-11-21T18:16:00Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(14,0,5,'2026-11-21T18:16:00Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(14,0,6,'2026-11-21T18:16:02Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(14,0,7,'2026-11-21T18:16:04Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(14,0,8,'2026-11-21T18:16:06Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(14,0,9,'2026-11-21T18:16:06Z ▶ install started');
INSERT INTO "log_lines" VALUES(14,0,10,'2026-11-21T18:17:10Z ✔ install succeeded in 64s');
INSERT INTO "log_lines" VALUES(14,0,11,'2026-11-21T18:17:12Z ▶ lint started');
INSERT INTO "log_lines" VALUES(14,0,12,'2026-11-21T18:17:41Z ✔ lint succeeded in 29s');
INSERT INTO "log_lines" VALUES(14,0,13,'2026-11-21T18:17:42Z ▶ build started');
INSERT INTO "log_lines" VALUES(14,0,14,'2026-11-21T18:18:33Z ✔ build succeeded in 51s');
INSERT INTO "log_lines" VALUES(14,0,15,'2026-11-21T18:18:35Z ▶ test started');
INSERT INTO "log_lines" VALUES(14,0,16,'2026-11-21T18:20:14Z ✔ test succeeded in 99s');
INSERT INTO "log_lines" VALUES(14,0,17,'2026-11-21T18:20:15Z Run succeeded');
INSERT INTO "log_lines" VALUES(14,80,1,'Reading .knecht/workflows/ci.yml at 133ad73');
INSERT INTO "log_lines" VALUES(14,80,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(14,81,1,'$ git clone --depth 1 https://git.acme.internal/acme/infra-live.git .');
INSERT INTO "log_lines" VALUES(14,81,2,'HEAD is now at 133ad73 on main');
INSERT INTO "log_lines" VALUES(14,82,1,'$ terraform init -input=false');
INSERT INTO "log_lines" VALUES(14,82,2,'Initializing the backend...');
INSERT INTO "log_lines" VALUES(14,82,3,'Initializing provider plugins...');
INSERT INTO "log_lines" VALUES(14,82,4,'- Installing hashicorp/aws v5.74.0...');
INSERT INTO "log_lines" VALUES(14,82,5,'Terraform has been successfully initialized!');
INSERT INTO "log_lines" VALUES(14,83,1,'$ terraform fmt -check -recursive && tflint');
INSERT INTO "log_lines" VALUES(14,83,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(14,84,1,'$ terraform plan -out=plan.tfplan');
INSERT INTO "log_lines" VALUES(14,84,2,'Refreshing state... [id=vpc-0a1b2c3d]');
INSERT INTO "log_lines" VALUES(14,84,3,'Plan: 3 to add, 1 to change, 0 to destroy.');
INSERT INTO "log_lines" VALUES(14,85,1,'$ go test ./test/... -timeout 30m');
INSERT INTO "log_lines" VALUES(14,85,2,'--- PASS: TestVpcModule (84.20s)');
INSERT INTO "log_lines" VALUES(14,85,3,'ok  	github.com/acme/infra-live/test	91.112s');
INSERT INTO "log_lines" VALUES(15,0,1,'2026-11-23T05:28:40Z Run #1 of ci (version 2) queued by jonas.weber via pull_request');
INSERT INTO "log_lines" VALUES(15,0,2,'2026-11-23T05:28:40Z Repository knecht-cli @ feature/status-watch (519088f590fb)');
INSERT INTO "log_lines" VALUES(15,0,3,'2026-11-23T05:29:43Z Picked up by runner knecht-runner-01');
INSERT INTO "log_lines" VALUES(15,0,4,'2026-11-23T05:29:43Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(15,0,5,'2026-11-23T05:29:43Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(15,0,6,'2026-11-23T05:29:44Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(15,0,7,'2026-11-23T05:29:47Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(15,0,8,'2026-11-23T05:29:50Z ✔ checkout succeeded in 3s');
INSERT INTO "log_lines" VALUES(15,0,9,'2026-11-23T05:29:53Z ▶ install started');
INSERT INTO "log_lines" VALUES(15,0,10,'2026-11-23T05:31:23Z ✔ install succeeded in 90s');
INSERT INTO "log_lines" VALUES(15,0,11,'2026-11-23T05:31:23Z ▶ lint started');
INSERT INTO "log_lines" VALUES(15,0,12,'2026-11-23T05:31:41Z ✔ lint succeeded in 18s');
INSERT INTO "log_lines" VALUES(15,0,13,'2026-11-23T05:31:44Z ▶ build started');
INSERT INTO "log_lines" VALUES(15,0,14,'2026-11-23T05:35:22Z ✔ build succeeded in 218s');
INSERT INTO "log_lines" VALUES(15,0,15,'2026-11-23T05:35:24Z ▶ test started');
INSERT INTO "log_lines" VALUES(15,0,16,'2026-11-23T05:41:38Z ✔ test succeeded in 374s');
INSERT INTO "log_lines" VALUES(15,0,17,'2026-11-23T05:41:41Z Run succeeded');
INSERT INTO "log_lines" VALUES(15,86,1,'Reading .knecht/workflows/ci.yml at 519088f');
INSERT INTO "log_lines" VALUES(15,86,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(15,87,1,'$ git clone --depth 1 https://git.acme.internal/acme/knecht-cli.git .');
INSERT INTO "log_lines" VALUES(15,87,2,'HEAD is now at 519088f on feature/status-watch');
INSERT INTO "log_lines" VALUES(15,88,1,'$ go mod download');
INSERT INTO "log_lines" VALUES(15,88,2,'go: downloading github.com/spf13/cobra v1.8.1');
INSERT INTO "log_lines" VALUES(15,88,3,'go: downloading github.com/charmbracelet/lipgloss v0.13.0');
INSERT INTO "log_lines" VALUES(15,88,4,'go: downloading golang.org/x/sync v0.8.0');
INSERT INTO "log_lines" VALUES(15,89,1,'$ go vet ./... && staticcheck ./...');
INSERT INTO "log_lines" VALUES(15,89,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(15,90,1,'$ go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli');
INSERT INTO "log_lines" VALUES(15,90,2,'building dist/knecht-cli for linux/amd64');
INSERT INTO "log_lines" VALUES(15,90,3,'dist/knecht-cli: 14.2 MB');
INSERT INTO "log_lines" VALUES(15,91,1,'$ go test -race ./...');
INSERT INTO "log_lines" VALUES(15,91,2,'ok  	github.com/acme/knecht-cli/internal/config	0.412s');
INSERT INTO "log_lines" VALUES(15,91,3,'ok  	github.com/acme/knecht-cli/internal/runner	2.873s');
INSERT INTO "log_lines" VALUES(15,91,4,'ok  	github.com/acme/knecht-cli/cmd/knecht-cli	1.104s');
INSERT INTO "log_lines" VALUES(16,0,1,'2026-11-23T23:14:42Z Run #5 of ci (version 1) queued by tom.nguyen via push');
INSERT INTO "log_lines" VALUES(16,0,2,'2026-11-23T23:14:42Z Repository storefront-web @ feature/cart-badge (effddeeaa842)');
INSERT INTO "log_lines" VALUES(16,0,3,'2026-11-23T23:15:10Z Picked up by runner knecht-runner-11');
INSERT INTO "log_lines" VALUES(16,0,4,'2026-11-23T23:15:10Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(16,0,5,'2026-11-23T23:15:10Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(16,0,6,'2026-11-23T23:15:11Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(16,0,7,'2026-11-23T23:15:14Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(16,0,8,'2026-11-23T23:15:18Z ✔ checkout succeeded in 4s');
INSERT INTO "log_lines" VALUES(16,0,9,'2026-11-23T23:15:21Z ▶ install started');
INSERT INTO "log_lines" VALUES(16,0,10,'2026-11-23T23:15:55Z ✔ install succeeded in 34s');
INSERT INTO "log_lines" VALUES(16,0,11,'2026-11-23T23:15:58Z ▶ lint started');
INSERT INTO "log_lines" VALUES(16,0,12,'2026-11-23T23:16:29Z ✔ lint succeeded in 31s');
INSERT INTO "log_lines" VALUES(16,0,13,'2026-11-23T23:16:32Z ▶ build started');
INSERT INTO "log_lines" VALUES(16,0,14,'2026-11-23T23:20:29Z ✔ build succeeded in 237s');
INSERT INTO "log_lines" VALUES(16,0,15,'2026-11-23T23:20:29Z ▶ test started');
INSERT INTO "log_lines" VALUES(16,0,16,'2026-11-23T23:22:21Z ✔ test succeeded in 112s');
INSERT INTO "log_lines" VALUES(16,0,17,'2026-11-23T23:22:22Z Run succeeded');
INSERT INTO "log_lines" VALUES(16,92,1,'Reading .knecht/workflows/ci.yml at effddee');
INSERT INTO "log_lines" VALUES(16,92,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(16,93,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(16,93,2,'HEAD is now at effddee on feature/cart-badge');
INSERT INTO "log_lines" VALUES(16,94,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(16,94,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(16,94,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(16,94,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(16,95,1,'$ npm run lint && npm run typecheck');
INSERT INTO "log_lines" VALUES(16,95,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(16,96,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(16,96,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(16,96,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(16,96,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(16,96,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(16,97,1,'$ npm test -- --ci --reporters=default');
INSERT INTO "log_lines" VALUES(16,97,2,'PASS src/cart/Cart.test.tsx');
INSERT INTO "log_lines" VALUES(16,97,3,'PASS src/checkout/Checkout.test.tsx');
INSERT INTO "log_lines" VALUES(16,97,4,'Test Suites: 58 passed, 58 total');
INSERT INTO "log_lines" VALUES(16,97,5,'Tests:       412 passed, 412 total');
INSERT INTO "log_lines" VALUES(17,0,1,'2026-11-26T05:01:58Z Run #2 of ci (version 2) queued by sara.okafor via pull_request');
INSERT INTO "log_lines" VALUES(17,0,2,'2026-11-26T05:01:58Z Repository knecht-cli @ fix/timeouts (74e69a5d0dd2)');
INSERT INTO "log_lines" VALUES(17,0,3,'2026-11-26T05:02:20Z Picked up by runner knecht-runner-10');
INSERT INTO "log_lines" VALUES(17,0,4,'2026-11-26T05:02:20Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(17,0,5,'2026-11-26T05:02:20Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(17,0,6,'2026-11-26T05:02:21Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(17,0,7,'2026-11-26T05:02:21Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(17,0,8,'2026-11-26T05:02:24Z ✔ checkout succeeded in 3s');
INSERT INTO "log_lines" VALUES(17,0,9,'2026-11-26T05:02:27Z ▶ install started');
INSERT INTO "log_lines" VALUES(17,0,10,'2026-11-26T05:03:49Z ✔ install succeeded in 82s');
INSERT INTO "log_lines" VALUES(17,0,11,'2026-11-26T05:03:50Z ▶ lint started');
INSERT INTO "log_lines" VALUES(17,0,12,'2026-11-26T05:04:17Z ✔ lint succeeded in 27s');
INSERT INTO "log_lines" VALUES(17,0,13,'2026-11-26T05:04:18Z ▶ build started');
INSERT INTO "log_lines" VALUES(17,0,14,'2026-11-26T05:05:09Z ✔ build succeeded in 51s');
INSERT INTO "log_lines" VALUES(17,0,15,'2026-11-26T05:05:12Z ▶ test started');
INSERT INTO "log_lines" VALUES(17,0,16,'2026-11-26T05:11:34Z ✔ test succeeded in 382s');
INSERT INTO "log_lines" VALUES(17,0,17,'2026-11-26T05:11:34Z Run succeeded');
INSERT INTO "log_lines" VALUES(17,98,1,'Reading .knecht/workflows/ci.yml at 74e69a5');
INSERT INTO "log_lines" VALUES(17,98,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(17,99,1,'$ git clone --depth 1 https://git.acme.internal/acme/knecht-cli.git .');
INSERT INTO "log_lines" VALUES(17,99,2,'HEAD is now at 74e69a5 on fix/timeouts');
INSERT INTO "log_lines" VALUES(17,100,1,'$ go mod download');
INSERT INTO "log_lines" VALUES(17,100,2,'go: downloading github.com/spf13/cobra v1.8.1');
INSERT INTO "log_lines" VALUES(17,100,3,'go: downloading github.com/charmbracelet/lipgloss v0.13.0');
INSERT INTO "log_lines" VALUES(17,100,4,'go: downloading golang.org/x/sync v0.8.0');
INSERT INTO "log_lines" VALUES(17,101,1,'$ go vet ./... && staticcheck ./...');
INSERT INTO "log_lines" VALUES(17,101,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(17,102,1,'$ go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli');
INSERT INTO "log_lines" VALUES(17,102,2,'building dist/knecht-cli for linux/amd64');
INSERT INTO "log_lines" VALUES(17,102,3,'dist/knecht-cli: 14.2 MB');
INSERT INTO "log_lines" VALUES(17,103,1,'$ go test -race ./...');
INSERT INTO "log_lines" VALUES(17,103,2,'ok  	github.com/acme/knecht-cli/internal/config	0.412s');
INSERT INTO "log_lines" VALUES(17,103,3,'ok  	github.com/acme/knecht-cli/internal/runner	2.873s');
INSERT INTO "log_lines" VALUES(17,103,4,'ok  	github.com/acme/knecht-cli/cmd/knecht-cli	1.104s');
INSERT INTO "log_lines" VALUES(18,0,1,'2026-11-27T21:20:31Z Run #1 of nightly (version 2) queued by knecht-scheduler via schedule');
INSERT INTO "log_lines" VALUES(18,0,2,'2026-11-27T21:20:31Z Repository knecht-cli @ main (c92bdd5aa3ec)');
INSERT INTO "log_lines" VALUES(18,0,3,'2026-11-27T21:21:52Z Picked up by runner knecht-runner-01');
INSERT INTO "log_lines" VALUES(18,0,4,'2026-11-27T21:21:52Z Inputs: {"suite": "full"}');
INSERT INTO "log_lines" VALUES(18,0,5,'2026-11-27T21:21:52Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(18,0,6,'2026-11-27T21:21:54Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(18,0,7,'2026-11-27T21:21:55Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(18,0,8,'2026-11-27T21:22:04Z ✔ checkout succeeded in 9s');
INSERT INTO "log_lines" VALUES(18,0,9,'2026-11-27T21:22:05Z ▶ install started');
INSERT INTO "log_lines" VALUES(18,0,10,'2026-11-27T21:23:37Z ✔ install succeeded in 92s');
INSERT INTO "log_lines" VALUES(18,0,11,'2026-11-27T21:23:40Z ▶ build started');
INSERT INTO "log_lines" VALUES(18,0,12,'2026-11-27T21:26:32Z ✔ build succeeded in 172s');
INSERT INTO "log_lines" VALUES(18,0,13,'2026-11-27T21:26:34Z ▶ test started');
INSERT INTO "log_lines" VALUES(18,0,14,'2026-11-27T21:29:40Z ✔ test succeeded in 186s');
INSERT INTO "log_lines" VALUES(18,0,15,'2026-11-27T21:29:41Z ▶ report started');
INSERT INTO "log_lines" VALUES(18,0,16,'2026-11-27T21:29:47Z ✔ report succeeded in 6s');
INSERT INTO "log_lines" VALUES(18,0,17,'2026-11-27T21:29:48Z Run succeeded');
INSERT INTO "log_lines" VALUES(18,104,1,'Reading .knecht/workflows/nightly.yml at c92bdd5');
INSERT INTO "log_lines" VALUES(18,104,2,'Workflow nightly: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(18,105,1,'$ git clone --depth 1 https://git.acme.internal/acme/knecht-cli.git .');
INSERT INTO "log_lines" VALUES(18,105,2,'HEAD is now at c92bdd5 on main');
INSERT INTO "log_lines" VALUES(18,106,1,'$ go mod download');
INSERT INTO "log_lines" VALUES(18,106,2,'go: downloading github.com/spf13/cobra v1.8.1');
INSERT INTO "log_lines" VALUES(18,106,3,'go: downloading github.com/charmbracelet/lipgloss v0.13.0');
INSERT INTO "log_lines" VALUES(18,106,4,'go: downloading golang.org/x/sync v0.8.0');
INSERT INTO "log_lines" VALUES(18,107,1,'$ go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli');
INSERT INTO "log_lines" VALUES(18,107,2,'building dist/knecht-cli for linux/amd64');
INSERT INTO "log_lines" VALUES(18,107,3,'dist/knecht-cli: 14.2 MB');
INSERT INTO "log_lines" VALUES(18,108,1,'$ go test -race ./...');
INSERT INTO "log_lines" VALUES(18,108,2,'ok  	github.com/acme/knecht-cli/internal/config	0.412s');
INSERT INTO "log_lines" VALUES(18,108,3,'ok  	github.com/acme/knecht-cli/internal/runner	2.873s');
INSERT INTO "log_lines" VALUES(18,108,4,'ok  	github.com/acme/knecht-cli/cmd/knecht-cli	1.104s');
INSERT INTO "log_lines" VALUES(18,109,1,'$ knecht report --format junit results/*.xml');
INSERT INTO "log_lines" VALUES(18,109,2,'Report uploaded: 1 file');
INSERT INTO "log_lines" VALUES(19,0,1,'2026-11-29T07:49:08Z Run #5 of ci (version 2) queued by anna.schmidt via pull_request');
INSERT INTO "log_lines" VALUES(19,0,2,'2026-11-29T07:49:08Z Repository fastcodec @ feature/no-std (c730a7cba085)');
INSERT INTO "log_lines" VALUES(19,0,3,'2026-11-29T07:50:03Z Picked up by runner knecht-runner-08');
INSERT INTO "log_lines" VALUES(19,0,4,'2026-11-29T07:50:03Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(19,0,5,'2026-11-29T07:50:03Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(19,0,6,'2026-11-29T07:50:05Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(19,0,7,'2026-11-29T07:50:06Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(19,0,8,'2026-11-29T07:50:14Z ✔ checkout succeeded in 8s');
INSERT INTO "log_lines" VALUES(19,0,9,'2026-11-29T07:50:17Z ▶ install started');
INSERT INTO "log_lines" VALUES(19,0,10,'2026-11-29T07:51:24Z ✔ install succeeded in 67s');
INSERT INTO "log_lines" VALUES(19,0,11,'2026-11-29T07:51:27Z ▶ lint started');
INSERT INTO "log_lines" VALUES(19,0,12,'2026-11-29T07:51:46Z ✔ lint succeeded in 19s');
INSERT INTO "log_lines" VALUES(19,0,13,'2026-11-29T07:51:46Z ▶ build started');
INSERT INTO "log_lines" VALUES(19,0,14,'2026-11-29T07:52:26Z ✔ build succeeded in 40s');
INSERT INTO "log_lines" VALUES(19,0,15,'2026-11-29T07:52:29Z ▶ test started');
INSERT INTO "log_lines" VALUES(19,0,16,'2026-11-29T08:01:25Z ✔ test succeeded in 536s');
INSERT INTO "log_lines" VALUES(19,0,17,'2026-11-29T08:01:26Z Run succeeded');
INSERT INTO "log_lines" VALUES(19,110,1,'Reading .knecht/workflows/ci.yml at c730a7c');
INSERT INTO "log_lines" VALUES(19,110,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(19,111,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(19,111,2,'HEAD is now at c730a7c on feature/no-std');
INSERT INTO "log_lines" VALUES(19,112,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(19,112,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(19,112,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(19,113,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(19,113,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(19,114,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(19,114,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(19,114,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(19,114,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(19,115,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(19,115,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(19,115,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(20,0,1,'2026-11-30T15:29:18Z Run #6 of ci (version 2) queued by anna.schmidt via push');
INSERT INTO "log_lines" VALUES(20,0,2,'2026-11-30T15:29:18Z Repository fastcodec @ feature/simd-decode (e9526a69d97e)');
INSERT INTO "log_lines" VALUES(20,0,3,'2026-11-30T15:29:31Z Picked up by runner knecht-runner-02');
INSERT INTO "log_lines" VALUES(20,0,4,'2026-11-30T15:29:31Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(20,0,5,'2026-11-30T15:29:31Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(20,0,6,'2026-11-30T15:29:33Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(20,0,7,'2026-11-30T15:29:33Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(20,0,8,'2026-11-30T15:29:35Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(20,0,9,'2026-11-30T15:29:36Z ▶ install started');
INSERT INTO "log_lines" VALUES(20,0,10,'2026-11-30T15:30:06Z ✔ install succeeded in 30s');
INSERT INTO "log_lines" VALUES(20,0,11,'2026-11-30T15:30:08Z ▶ lint started');
INSERT INTO "log_lines" VALUES(20,0,12,'2026-11-30T15:30:48Z ✔ lint succeeded in 40s');
INSERT INTO "log_lines" VALUES(20,0,13,'2026-11-30T15:30:48Z ▶ build started');
INSERT INTO "log_lines" VALUES(20,0,14,'2026-11-30T15:31:41Z ✔ build succeeded in 53s');
INSERT INTO "log_lines" VALUES(20,0,15,'2026-11-30T15:31:44Z ▶ test started');
INSERT INTO "log_lines" VALUES(20,0,16,'2026-11-30T15:35:03Z ✔ test succeeded in 199s');
INSERT INTO "log_lines" VALUES(20,0,17,'2026-11-30T15:35:03Z Run succeeded');
INSERT INTO "log_lines" VALUES(20,116,1,'Reading .knecht/workflows/ci.yml at e9526a6');
INSERT INTO "log_lines" VALUES(20,116,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(20,117,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(20,117,2,'HEAD is now at e9526a6 on feature/simd-decode');
INSERT INTO "log_lines" VALUES(20,118,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(20,118,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(20,118,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(20,119,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(20,119,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(20,120,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(20,120,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(20,120,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(20,120,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(20,121,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(20,121,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(20,121,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(21,0,1,'2026-12-02T11:51:37Z Run #1 of release (version 2) queued by jonas.weber via manual');
INSERT INTO "log_lines" VALUES(21,0,2,'2026-12-02T11:51:37Z Repository fastcodec @ main (ea81ad63cf9d)');
INSERT INTO "log_lines" VALUES(21,0,3,'2026-12-02T11:51:47Z Picked up by runner knecht-runner-03');
INSERT INTO "log_lines" VALUES(21,0,4,'2026-12-02T11:51:47Z Inputs: {"dry_run": false, "environment": "staging", "version": "v3.0.1"}');
INSERT INTO "log_lines" VALUES(21,0,5,'2026-12-02T11:51:47Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(21,0,6,'2026-12-02T11:51:49Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(21,0,7,'2026-12-02T11:51:51Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(21,0,8,'2026-12-02T11:51:55Z ✔ checkout succeeded in 4s');
INSERT INTO "log_lines" VALUES(21,0,9,'2026-12-02T11:51:57Z ▶ install started');
INSERT INTO "log_lines" VALUES(21,0,10,'2026-12-02T11:52:52Z ✔ install succeeded in 55s');
INSERT INTO "log_lines" VALUES(21,0,11,'2026-12-02T11:52:55Z ▶ build started');
INSERT INTO "log_lines" VALUES(21,0,12,'2026-12-02T11:54:11Z ✔ build succeeded in 76s');
INSERT INTO "log_lines" VALUES(21,0,13,'2026-12-02T11:54:14Z ▶ test started');
INSERT INTO "log_lines" VALUES(21,0,14,'2026-12-02T11:58:47Z ✔ test succeeded in 273s');
INSERT INTO "log_lines" VALUES(21,0,15,'2026-12-02T11:58:49Z ▶ publish started');
INSERT INTO "log_lines" VALUES(21,0,16,'2026-12-02T11:59:31Z ✔ publish succeeded in 42s');
INSERT INTO "log_lines" VALUES(21,0,17,'2026-12-02T11:59:32Z ▶ deploy started');
INSERT INTO "log_lines" VALUES(21,0,18,'2026-12-02T12:01:38Z ✔ deploy succeeded in 126s');
INSERT INTO "log_lines" VALUES(21,0,19,'2026-12-02T12:01:39Z Run succeeded');
INSERT INTO "log_lines" VALUES(21,122,1,'Reading .knecht/workflows/release.yml at ea81ad6');
INSERT INTO "log_lines" VALUES(21,122,2,'Workflow release: 6 actions, inputs validated');
INSERT INTO "log_lines" VALUES(21,123,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(21,123,2,'HEAD is now at ea81ad6 on main');
INSERT INTO "log_lines" VALUES(21,124,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(21,124,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(21,124,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(21,125,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(21,125,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(21,125,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(21,125,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(21,126,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(21,126,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(21,126,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(21,127,1,'$ knecht artifacts upload dist/');
INSERT INTO "log_lines" VALUES(21,127,2,'Uploaded 3 artifacts to acme-fastcodec-artifacts');
INSERT INTO "log_lines" VALUES(21,128,1,'$ cargo publish --token $CARGO_REGISTRY_TOKEN');
INSERT INTO "log_lines" VALUES(21,128,2,'Deployed fastcodec ea81ad6 successfully');
INSERT INTO "log_lines" VALUES(22,0,1,'2026-12-03T02:31:29Z Run #6 of ci (version 1) queued by mei.chen via push');
INSERT INTO "log_lines" VALUES(22,0,2,'2026-12-03T02:31:29Z Repository storefront-web @ main (20859634fe3c)');
INSERT INTO "log_lines" VALUES(22,0,3,'2026-12-03T02:32:52Z Picked up by runner knecht-runner-02');
INSERT INTO "log_lines" VALUES(22,0,4,'2026-12-03T02:32:52Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(22,0,5,'2026-12-03T02:32:52Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(22,0,6,'2026-12-03T02:32:54Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(22,0,7,'2026-12-03T02:32:57Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(22,0,8,'2026-12-03T02:33:00Z ✔ checkout succeeded in 3s');
INSERT INTO "log_lines" VALUES(22,0,9,'2026-12-03T02:33:02Z ▶ install started');
INSERT INTO "log_lines" VALUES(22,0,10,'2026-12-03T02:34:30Z ✔ install succeeded in 88s');
INSERT INTO "log_lines" VALUES(22,0,11,'2026-12-03T02:34:33Z ▶ lint started');
INSERT INTO "log_lines" VALUES(22,0,12,'2026-12-03T02:35:04Z ✔ lint succeeded in 31s');
INSERT INTO "log_lines" VALUES(22,0,13,'2026-12-03T02:35:06Z ▶ build started');
INSERT INTO "log_lines" VALUES(22,0,14,'2026-12-03T02:37:22Z ✔ build succeeded in 136s');
INSERT INTO "log_lines" VALUES(22,0,15,'2026-12-03T02:37:23Z ▶ test started');
INSERT INTO "log_lines" VALUES(22,0,16,'2026-12-03T02:44:31Z ✔ test succeeded in 428s');
INSERT INTO "log_lines" VALUES(22,0,17,'2026-12-03T02:44:33Z Run succeeded');
INSERT INTO "log_lines" VALUES(22,129,1,'Reading .knecht/workflows/ci.yml at 2085963');
INSERT INTO "log_lines" VALUES(22,129,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(22,130,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(22,130,2,'HEAD is now at 2085963 on main');
INSERT INTO "log_lines" VALUES(22,131,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(22,131,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(22,131,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(22,131,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(22,132,1,'$ npm run lint && npm run typecheck');
INSERT INTO "log_lines" VALUES(22,132,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(22,133,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(22,133,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(22,133,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(22,133,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(22,133,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(22,134,1,'$ npm test -- --ci --reporters=default');
INSERT INTO "log_lines" VALUES(22,134,2,'PASS src/cart/Cart.test.tsx');
INSERT INTO "log_lines" VALUES(22,134,3,'PASS src/checkout/Checkout.test.tsx');
INSERT INTO "log_lines" VALUES(22,134,4,'Test Suites: 58 passed, 58 total');
INSERT INTO "log_lines" VALUES(22,134,5,'Tests:       412 passed, 412 total');
INSERT INTO "log_lines" VALUES(23,0,1,'2026-12-04T15:55:19Z Run #2 of ci (version 2) queued by sara.okafor via rerun (rerun of run 13)');
INSERT INTO "log_lines" VALUES(23,0,2,'2026-12-04T15:55:19Z Repository payments-api @ main (a6a3a4506513)');
INSERT INTO "log_lines" VALUES(23,0,3,'2026-12-04T15:56:35Z Picked up by runner knecht-runner-07');
INSERT INTO "log_lines" VALUES(23,0,4,'2026-12-04T15:56:35Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(23,0,5,'2026-12-04T15:56:35Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(23,0,6,'2026-12-04T15:56:37Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(23,0,7,'2026-12-04T15:56:37Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(23,0,8,'2026-12-04T15:56:39Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(23,0,9,'2026-12-04T15:56:40Z ▶ install started');
INSERT INTO "log_lines" VALUES(23,0,10,'2026-12-04T15:57:19Z ✖ install failed in 39s (exit code 1)');
INSERT INTO "log_lines" VALUES(23,0,11,'2026-12-04T15:57:22Z Run failed: action ''install'' failed; remaining actions skipped');
INSERT INTO "log_lines" VALUES(23,135,1,'Reading .knecht/workflows/ci.yml at a6a3a45');
INSERT INTO "log_lines" VALUES(23,135,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(23,136,1,'$ git clone --depth 1 https://git.acme.internal/acme/payments-api.git .');
INSERT INTO "log_lines" VALUES(23,136,2,'HEAD is now at a6a3a45 on main');
INSERT INTO "log_lines" VALUES(23,137,1,'$ pip install -r requirements.txt -r requirements-dev.txt');
INSERT INTO "log_lines" VALUES(23,137,2,'Collecting fastapi==0.115.4');
INSERT INTO "log_lines" VALUES(23,137,3,'Collecting pydantic<2');
INSERT INTO "log_lines" VALUES(23,137,4,'INFO: pip is looking at multiple versions of fastapi to determine which version is compatible.');
INSERT INTO "log_lines" VALUES(23,137,5,'ERROR: Cannot install -r requirements.txt (line 3) and pydantic<2 because these package versions have conflicting dependencies.');
INSERT INTO "log_lines" VALUES(23,137,6,'');
INSERT INTO "log_lines" VALUES(23,137,7,'The conflict is caused by:');
INSERT INTO "log_lines" VALUES(23,137,8,'    The user requested pydantic<2');
INSERT INTO "log_lines" VALUES(23,137,9,'    fastapi 0.115.4 depends on pydantic!=1.8, !=2.0.0, !=2.1.0, <3.0.0 and >=1.7.4');
INSERT INTO "log_lines" VALUES(23,137,10,'    sqlmodel 0.0.22 depends on pydantic>=2.0');
INSERT INTO "log_lines" VALUES(23,137,11,'');
INSERT INTO "log_lines" VALUES(23,137,12,'ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/#dealing-with-dependency-conflicts');
INSERT INTO "log_lines" VALUES(23,137,13,'Error: ''pip install -r requirements.txt -r requirements-dev.txt'' exited with code 1');
INSERT INTO "log_lines" VALUES(24,0,1,'2026-12-06T06:27:23Z Run #3 of ci (version 2) queued by anna.schmidt via push');
INSERT INTO "log_lines" VALUES(24,0,2,'2026-12-06T06:27:23Z Repository infra-live @ feature/rds-upgrade (27be9ab1c023)');
INSERT INTO "log_lines" VALUES(24,0,3,'2026-12-06T06:27:38Z Picked up by runner knecht-runner-02');
INSERT INTO "log_lines" VALUES(24,0,4,'2026-12-06T06:27:38Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(24,0,5,'2026-12-06T06:27:38Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(24,0,6,'2026-12-06T06:27:40Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(24,0,7,'2026-12-06T06:27:41Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(24,0,8,'2026-12-06T06:27:49Z ✔ checkout succeeded in 8s');
INSERT INTO "log_lines" VALUES(24,0,9,'2026-12-06T06:27:51Z ▶ install started');
INSERT INTO "log_lines" VALUES(24,0,10,'2026-12-06T06:29:26Z ✔ install succeeded in 95s');
INSERT INTO "log_lines" VALUES(24,0,11,'2026-12-06T06:29:28Z ▶ lint started');
INSERT INTO "log_lines" VALUES(24,0,12,'2026-12-06T06:30:06Z ✔ lint succeeded in 38s');
INSERT INTO "log_lines" VALUES(24,0,13,'2026-12-06T06:30:07Z ▶ build started');
INSERT INTO "log_lines" VALUES(24,0,14,'2026-12-06T06:31:21Z ✔ build succeeded in 74s');
INSERT INTO "log_lines" VALUES(24,0,15,'2026-12-06T06:31:22Z ▶ test started');
INSERT INTO "log_lines" VALUES(24,0,16,'2026-12-06T06:34:54Z ✔ test succeeded in 212s');
INSERT INTO "log_lines" VALUES(24,0,17,'2026-12-06T06:34:57Z Run succeeded');
INSERT INTO "log_lines" VALUES(24,141,1,'Reading .knecht/workflows/ci.yml at 27be9ab');
INSERT INTO "log_lines" VALUES(24,141,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(24,142,1,'$ git clone --depth 1 https://git.acme.internal/acme/infra-live.git .');
INSERT INTO "log_lines" VALUES(24,142,2,'HEAD is now at 27be9ab on feature/rds-upgrade');
INSERT INTO "log_lines" VALUES(24,143,1,'$ terraform init -input=false');
INSERT INTO "log_lines" VALUES(24,143,2,'Initializing the backend...');
INSERT INTO "log_lines" VALUES(24,143,3,'Initializing provider plugins...');
INSERT INTO "log_lines" VALUES(24,143,4,'- Installing hashicorp/aws v5.74.0...');
INSERT INTO "log_lines" VALUES(24,143,5,'Terraform has been successfully initialized!');
INSERT INTO "log_lines" VALUES(24,144,1,'$ terraform fmt -check -recursive && tflint');
INSERT INTO "log_lines" VALUES(24,144,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(24,145,1,'$ terraform plan -out=plan.tfplan');
INSERT INTO "log_lines" VALUES(24,145,2,'Refreshing state... [id=vpc-0a1b2c3d]');
INSERT INTO "log_lines" VALUES(24,145,3,'Plan: 3 to add, 1 to change, 0 to destroy.');
INSERT INTO "log_lines" VALUES(24,145,4,'Connecting to postgres://infra_live:7neLfjVHq8xiM0OGr4@db.internal:5432/infra_live for migrations check… ok');
INSERT INTO "log_lines" VALUES(24,146,1,'$ go test ./test/... -timeout 30m');
INSERT INTO "log_lines" VALUES(24,146,2,'--- PASS: TestVpcModule (84.20s)');
INSERT INTO "log_lines" VALUES(24,146,3,'ok  	github.com/acme/infra-live/test	91.112s');
INSERT INTO "log_lines" VALUES(25,0,1,'2026-12-07T02:17:31Z Run #3 of ci (version 2) queued by anna.schmidt via pull_request');
INSERT INTO "log_lines" VALUES(25,0,2,'2026-12-07T02:17:31Z Repository payments-api @ feature/refund-currency (a5464f6d983f)');
INSERT INTO "log_lines" VALUES(25,0,3,'2026-12-07T02:18:50Z Picked up by runner knecht-runner-03');
INSERT INTO "log_lines" VALUES(25,0,4,'2026-12-07T02:18:50Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(25,0,5,'2026-12-07T02:18:50Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(25,0,6,'2026-12-07T02:18:52Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(25,0,7,'2026-12-07T02:18:53Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(25,0,8,'2026-12-07T02:18:57Z ✔ checkout succeeded in 4s');
INSERT INTO "log_lines" VALUES(25,0,9,'2026-12-07T02:18:57Z ▶ install started');
INSERT INTO "log_lines" VALUES(25,0,10,'2026-12-07T02:19:22Z ✔ install succeeded in 25s');
INSERT INTO "log_lines" VALUES(25,0,11,'2026-12-07T02:19:22Z ▶ lint started');
INSERT INTO "log_lines" VALUES(25,0,12,'2026-12-07T02:19:55Z ✔ lint succeeded in 33s');
INSERT INTO "log_lines" VALUES(25,0,13,'2026-12-07T02:19:56Z ▶ build started');
INSERT INTO "log_lines" VALUES(25,0,14,'2026-12-07T02:21:36Z ✔ build succeeded in 100s');
INSERT INTO "log_lines" VALUES(25,0,15,'2026-12-07T02:21:36Z ▶ test started');
INSERT INTO "log_lines" VALUES(25,0,16,'2026-12-07T02:22:48Z ✔ test succeeded in 72s');
INSERT INTO "log_lines" VALUES(25,0,17,'2026-12-07T02:22:49Z Run succeeded');
INSERT INTO "log_lines" VALUES(25,147,1,'Reading .knecht/workflows/ci.yml at a5464f6');
INSERT INTO "log_lines" VALUES(25,147,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(25,148,1,'$ git clone --depth 1 https://git.acme.internal/acme/payments-api.git .');
INSERT INTO "log_lines" VALUES(25,148,2,'HEAD is now at a5464f6 on feature/refund-currency');
INSERT INTO "log_lines" VALUES(25,149,1,'$ pip install -r requirements.txt -r requirements-dev.txt');
INSERT INTO "log_lines" VALUES(25,149,2,'+ echo AWS_ACCESS_KEY_ID=AKIAHODZDOC9IS0J8HT9');
INSERT INTO "log_lines" VALUES(25,149,3,'AWS_ACCESS_KEY_ID=AKIAHODZDOC9IS0J8HT9');
INSERT INTO "log_lines" VALUES(25,149,4,'Collecting fastapi==0.115.4');
INSERT INTO "log_lines" VALUES(25,149,5,'Collecting sqlalchemy==2.0.36');
INSERT INTO "log_lines" VALUES(25,149,6,'Collecting psycopg[binary]==3.2.3');
INSERT INTO "log_lines" VALUES(25,149,7,'Installing collected packages: typing-extensions, pydantic-core, pydantic, starlette, fastapi');
INSERT INTO "log_lines" VALUES(25,149,8,'Successfully installed 47 packages');
INSERT INTO "log_lines" VALUES(25,150,1,'$ ruff check . && mypy app');
INSERT INTO "log_lines" VALUES(25,150,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(25,151,1,'$ docker build -t registry.internal/payments-api:a5464f6 .');
INSERT INTO "log_lines" VALUES(25,151,2,'#5 [2/6] COPY requirements.txt .');
INSERT INTO "log_lines" VALUES(25,151,3,'#6 [3/6] RUN pip install --no-cache-dir -r requirements.txt');
INSERT INTO "log_lines" VALUES(25,151,4,'#9 exporting to image');
INSERT INTO "log_lines" VALUES(25,151,5,'#9 naming to registry.internal/payments-api:a5464f6 done');
INSERT INTO "log_lines" VALUES(25,152,1,'$ pytest -q --maxfail=1');
INSERT INTO "log_lines" VALUES(25,152,2,'============================= test session starts ==============================');
INSERT INTO "log_lines" VALUES(25,152,3,'collected 312 items');
INSERT INTO "log_lines" VALUES(25,152,4,'tests/test_api.py ........................................................ [ 18%]');
INSERT INTO "log_lines" VALUES(25,152,5,'tests/test_payments.py ................................................... [ 61%]');
INSERT INTO "log_lines" VALUES(25,152,6,'tests/test_webhooks.py ................................................... [100%]');
INSERT INTO "log_lines" VALUES(25,152,7,'======================= 312 passed in 41.27s ===================================');
INSERT INTO "log_lines" VALUES(26,0,1,'2026-12-09T02:52:27Z Run #7 of ci (version 2) queued by sara.okafor via pull_request');
INSERT INTO "log_lines" VALUES(26,0,2,'2026-12-09T02:52:27Z Repository storefront-web @ fix/ci-cache (057a40b22188)');
INSERT INTO "log_lines" VALUES(26,0,3,'2026-12-09T02:53:07Z Picked up by runner knecht-runner-11');
INSERT INTO "log_lines" VALUES(26,0,4,'2026-12-09T02:53:07Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(26,0,5,'2026-12-09T02:53:07Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(26,0,6,'2026-12-09T02:53:08Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(26,0,7,'2026-12-09T02:53:11Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(26,0,8,'2026-12-09T02:53:13Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(26,0,9,'2026-12-09T02:53:16Z ▶ install started');
INSERT INTO "log_lines" VALUES(26,0,10,'2026-12-09T02:54:31Z ✔ install succeeded in 75s');
INSERT INTO "log_lines" VALUES(26,0,11,'2026-12-09T02:54:34Z ▶ lint started');
INSERT INTO "log_lines" VALUES(26,0,12,'2026-12-09T02:54:47Z ✔ lint succeeded in 13s');
INSERT INTO "log_lines" VALUES(26,0,13,'2026-12-09T02:54:50Z ▶ build started');
INSERT INTO "log_lines" VALUES(26,0,14,'2026-12-09T02:56:14Z ✔ build succeeded in 84s');
INSERT INTO "log_lines" VALUES(26,0,15,'2026-12-09T02:56:14Z ▶ test started');
INSERT INTO "log_lines" VALUES(26,0,16,'2026-12-09T03:01:41Z ✔ test succeeded in 327s');
INSERT INTO "log_lines" VALUES(26,0,17,'2026-12-09T03:01:42Z Run succeeded');
INSERT INTO "log_lines" VALUES(26,153,1,'Reading .knecht/workflows/ci.yml at 057a40b');
INSERT INTO "log_lines" VALUES(26,153,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(26,154,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(26,154,2,'HEAD is now at 057a40b on fix/ci-cache');
INSERT INTO "log_lines" VALUES(26,155,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(26,155,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(26,155,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(26,155,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(26,156,1,'$ npm run lint && npm run typecheck');
INSERT INTO "log_lines" VALUES(26,156,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(26,157,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(26,157,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(26,157,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(26,157,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(26,157,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(26,158,1,'$ npm test -- --ci --reporters=default');
INSERT INTO "log_lines" VALUES(26,158,2,'PASS src/cart/Cart.test.tsx');
INSERT INTO "log_lines" VALUES(26,158,3,'PASS src/checkout/Checkout.test.tsx');
INSERT INTO "log_lines" VALUES(26,158,4,'Test Suites: 58 passed, 58 total');
INSERT INTO "log_lines" VALUES(26,158,5,'Tests:       412 passed, 412 total');
INSERT INTO "log_lines" VALUES(27,0,1,'2026-12-10T01:23:50Z Run #3 of ci (version 2) queued by tom.nguyen via pull_request');
INSERT INTO "log_lines" VALUES(27,0,2,'2026-12-10T01:23:50Z Repository knecht-cli @ feature/log-follow (83f73f16dbf4)');
INSERT INTO "log_lines" VALUES(27,0,3,'2026-12-10T01:25:18Z Picked up by runner knecht-runner-04');
INSERT INTO "log_lines" VALUES(27,0,4,'2026-12-10T01:25:18Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(27,0,5,'2026-12-10T01:25:18Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(27,0,6,'2026-12-10T01:25:20Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(27,0,7,'2026-12-10T01:25:22Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(27,0,8,'2026-12-10T01:25:28Z ✔ checkout succeeded in 6s');
INSERT INTO "log_lines" VALUES(27,0,9,'2026-12-10T01:25:29Z ▶ install started');
INSERT INTO "log_lines" VALUES(27,0,10,'2026-12-10T01:25:59Z ✔ install succeeded in 30s');
INSERT INTO "log_lines" VALUES(27,0,11,'2026-12-10T01:25:59Z ▶ lint started');
INSERT INTO "log_lines" VALUES(27,0,12,'2026-12-10T01:26:17Z ✔ lint succeeded in 18s');
INSERT INTO "log_lines" VALUES(27,0,13,'2026-12-10T01:26:19Z ▶ build started');
INSERT INTO "log_lines" VALUES(27,0,14,'2026-12-10T01:27:59Z ✔ build succeeded in 100s');
INSERT INTO "log_lines" VALUES(27,0,15,'2026-12-10T01:28:00Z ▶ test started');
INSERT INTO "log_lines" VALUES(27,0,16,'2026-12-10T01:31:43Z ✔ test succeeded in 223s');
INSERT INTO "log_lines" VALUES(27,0,17,'2026-12-10T01:31:45Z Run succeeded');
INSERT INTO "log_lines" VALUES(27,159,1,'Reading .knecht/workflows/ci.yml at 83f73f1');
INSERT INTO "log_lines" VALUES(27,159,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(27,160,1,'$ git clone --depth 1 https://git.acme.internal/acme/knecht-cli.git .');
INSERT INTO "log_lines" VALUES(27,160,2,'HEAD is now at 83f73f1 on feature/log-follow');
INSERT INTO "log_lines" VALUES(27,161,1,'$ go mod download');
INSERT INTO "log_lines" VALUES(27,161,2,'go: downloading github.com/spf13/cobra v1.8.1');
INSERT INTO "log_lines" VALUES(27,161,3,'go: downloading github.com/charmbracelet/lipgloss v0.13.0');
INSERT INTO "log_lines" VALUES(27,161,4,'go: downloading golang.org/x/sync v0.8.0');
INSERT INTO "log_lines" VALUES(27,162,1,'$ go vet ./... && staticcheck ./...');
INSERT INTO "log_lines" VALUES(27,162,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(27,163,1,'$ go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli');
INSERT INTO "log_lines" VALUES(27,163,2,'building dist/knecht-cli for linux/amd64');
INSERT INTO "log_lines" VALUES(27,163,3,'dist/knecht-cli: 14.2 MB');
INSERT INTO "log_lines" VALUES(27,164,1,'$ go test -race ./...');
INSERT INTO "log_lines" VALUES(27,164,2,'ok  	github.com/acme/knecht-cli/internal/config	0.412s');
INSERT INTO "log_lines" VALUES(27,164,3,'ok  	github.com/acme/knecht-cli/internal/runner	2.873s');
INSERT INTO "log_lines" VALUES(27,164,4,'ok  	github.com/acme/knecht-cli/cmd/knecht-cli	1.104s');
INSERT INTO "log_lines" VALUES(28,0,1,'2026-12-12T19:41:09Z Run #4 of ci (version 2) queued by tom.nguyen via pull_request');
INSERT INTO "log_lines" VALUES(28,0,2,'2026-12-12T19:41:09Z Repository knecht-cli @ fix/timeouts (78de33617830)');
INSERT INTO "log_lines" VALUES(28,0,3,'2026-12-12T19:41:11Z Picked up by runner knecht-runner-03');
INSERT INTO "log_lines" VALUES(28,0,4,'2026-12-12T19:41:11Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(28,0,5,'2026-12-12T19:41:11Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(28,0,6,'2026-12-12T19:41:12Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(28,0,7,'2026-12-12T19:41:15Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(28,0,8,'2026-12-12T19:41:20Z ✔ checkout succeeded in 5s');
INSERT INTO "log_lines" VALUES(28,0,9,'2026-12-12T19:41:22Z ▶ install started');
INSERT INTO "log_lines" VALUES(28,0,10,'2026-12-12T19:42:09Z ✔ install succeeded in 47s');
INSERT INTO "log_lines" VALUES(28,0,11,'2026-12-12T19:42:09Z ▶ lint started');
INSERT INTO "log_lines" VALUES(28,0,12,'2026-12-12T19:42:27Z ✔ lint succeeded in 18s');
INSERT INTO "log_lines" VALUES(28,0,13,'2026-12-12T19:42:28Z ▶ build started');
INSERT INTO "log_lines" VALUES(28,0,14,'2026-12-12T19:43:16Z ✔ build succeeded in 48s');
INSERT INTO "log_lines" VALUES(28,0,15,'2026-12-12T19:43:16Z ▶ test started');
INSERT INTO "log_lines" VALUES(28,0,16,'2026-12-12T19:47:01Z ✔ test succeeded in 225s');
INSERT INTO "log_lines" VALUES(28,0,17,'2026-12-12T19:47:03Z Run succeeded');
INSERT INTO "log_lines" VALUES(28,165,1,'Reading .knecht/workflows/ci.yml at 78de336');
INSERT INTO "log_lines" VALUES(28,165,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(28,166,1,'$ git clone --depth 1 https://git.acme.internal/acme/knecht-cli.git .');
INSERT INTO "log_lines" VALUES(28,166,2,'HEAD is now at 78de336 on fix/timeouts');
INSERT INTO "log_lines" VALUES(28,167,1,'$ go mod download');
INSERT INTO "log_lines" VALUES(28,167,2,'go: downloading github.com/spf13/cobra v1.8.1');
INSERT INTO "log_lines" VALUES(28,167,3,'go: downloading github.com/charmbracelet/lipgloss v0.13.0');
INSERT INTO "log_lines" VALUES(28,167,4,'go: downloading golang.org/x/sync v0.8.0');
INSERT INTO "log_lines" VALUES(28,168,1,'$ go vet ./... && staticcheck ./...');
INSERT INTO "log_lines" VALUES(28,168,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(28,169,1,'$ go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli');
INSERT INTO "log_lines" VALUES(28,169,2,'building dist/knecht-cli for linux/amd64');
INSERT INTO "log_lines" VALUES(28,169,3,'dist/knecht-cli: 14.2 MB');
INSERT INTO "log_lines" VALUES(28,169,4,'Connecting to postgres://knecht_cli:9wCZ7Uw9xfogoEmvnE@db.internal:5432/knecht_cli for migrations check… ok');
INSERT INTO "log_lines" VALUES(28,170,1,'$ go test -race ./...');
INSERT INTO "log_lines" VALUES(28,170,2,'ok  	github.com/acme/knecht-cli/internal/config	0.412s');
INSERT INTO "log_lines" VALUES(28,170,3,'ok  	github.com/acme/knecht-cli/internal/runner	2.873s');
INSERT INTO "log_lines" VALUES(28,170,4,'ok  	github.com/acme/knecht-cli/cmd/knecht-cli	1.104s');
INSERT INTO "log_lines" VALUES(29,0,1,'2026-12-14T01:13:35Z Run #4 of ci (version 2) queued by anna.schmidt via push');
INSERT INTO "log_lines" VALUES(29,0,2,'2026-12-14T01:13:35Z Repository payments-api @ main (a6a3a4506513)');
INSERT INTO "log_lines" VALUES(29,0,3,'2026-12-14T01:14:23Z Picked up by runner knecht-runner-03');
INSERT INTO "log_lines" VALUES(29,0,4,'2026-12-14T01:14:23Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(29,0,5,'2026-12-14T01:14:23Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(29,0,6,'2026-12-14T01:14:24Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(29,0,7,'2026-12-14T01:14:24Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(29,0,8,'2026-12-14T01:14:32Z ✔ checkout succeeded in 8s');
INSERT INTO "log_lines" VALUES(29,0,9,'2026-12-14T01:14:32Z ▶ install started');
INSERT INTO "log_lines" VALUES(29,0,10,'2026-12-14T01:15:23Z ✔ install succeeded in 51s');
INSERT INTO "log_lines" VALUES(29,0,11,'2026-12-14T01:15:23Z ▶ lint started');
INSERT INTO "log_lines" VALUES(29,0,12,'2026-12-14T01:15:33Z ✔ lint succeeded in 10s');
INSERT INTO "log_lines" VALUES(29,0,13,'2026-12-14T01:15:33Z ▶ build started');
INSERT INTO "log_lines" VALUES(29,0,14,'2026-12-14T01:19:25Z ✔ build succeeded in 232s');
INSERT INTO "log_lines" VALUES(29,0,15,'2026-12-14T01:19:27Z ▶ test started');
INSERT INTO "log_lines" VALUES(29,0,16,'2026-12-14T01:28:35Z ✔ test succeeded in 548s');
INSERT INTO "log_lines" VALUES(29,0,17,'2026-12-14T01:28:35Z Run succeeded');
INSERT INTO "log_lines" VALUES(29,171,1,'Reading .knecht/workflows/ci.yml at a6a3a45');
INSERT INTO "log_lines" VALUES(29,171,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(29,172,1,'$ git clone --depth 1 https://git.acme.internal/acme/payments-api.git .');
INSERT INTO "log_lines" VALUES(29,172,2,'HEAD is now at a6a3a45 on main');
INSERT INTO "log_lines" VALUES(29,173,1,'$ pip install -r requirements.txt -r requirements-dev.txt');
INSERT INTO "log_lines" VALUES(29,173,2,'Collecting fastapi==0.115.4');
INSERT INTO "log_lines" VALUES(29,173,3,'Collecting sqlalchemy==2.0.36');
INSERT INTO "log_lines" VALUES(29,173,4,'Collecting psycopg[binary]==3.2.3');
INSERT INTO "log_lines" VALUES(29,173,5,'Installing collected packages: typing-extensions, pydantic-core, pydantic, starlette, fastapi');
INSERT INTO "log_lines" VALUES(29,173,6,'Successfully installed 47 packages');
INSERT INTO "log_lines" VALUES(29,174,1,'$ ruff check . && mypy app');
INSERT INTO "log_lines" VALUES(29,174,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(29,175,1,'$ docker build -t registry.internal/payments-api:a6a3a45 .');
INSERT INTO "log_lines" VALUES(29,175,2,'#5 [2/6] COPY requirements.txt .');
INSERT INTO "log_lines" VALUES(29,175,3,'#6 [3/6] RUN pip install --no-cache-dir -r requirements.txt');
INSERT INTO "log_lines" VALUES(29,175,4,'#9 exporting to image');
INSERT INTO "log_lines" VALUES(29,175,5,'#9 naming to registry.internal/payments-api:a6a3a45 done');
INSERT INTO "log_lines" VALUES(29,176,1,'$ pytest -q --maxfail=1');
INSERT INTO "log_lines" VALUES(29,176,2,'============================= test session starts ==============================');
INSERT INTO "log_lines" VALUES(29,176,3,'collected 312 items');
INSERT INTO "log_lines" VALUES(29,176,4,'tests/test_api.py ........................................................ [ 18%]');
INSERT INTO "log_lines" VALUES(29,176,5,'tests/test_payments.py ................................................... [ 61%]');
INSERT INTO "log_lines" VALUES(29,176,6,'tests/test_webhooks.py ................................................... [100%]');
INSERT INTO "log_lines" VALUES(29,176,7,'======================= 312 passed in 41.27s ===================================');
INSERT INTO "log_lines" VALUES(30,0,1,'2026-12-14T15:31:22Z Run #7 of ci (version 2) queued by anna.schmidt via push');
INSERT INTO "log_lines" VALUES(30,0,2,'2026-12-14T15:31:22Z Repository fastcodec @ main (c285a8c6b73c)');
INSERT INTO "log_lines" VALUES(30,0,3,'2026-12-14T15:32:05Z Picked up by runner knecht-runner-03');
INSERT INTO "log_lines" VALUES(30,0,4,'2026-12-14T15:32:05Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(30,0,5,'2026-12-14T15:32:05Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(30,0,6,'2026-12-14T15:32:07Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(30,0,7,'2026-12-14T15:32:09Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(30,0,8,'2026-12-14T15:32:11Z ✔ checkout succeeded in 2s');
INSERT INTO "log_lines" VALUES(30,0,9,'2026-12-14T15:32:14Z ▶ install started');
INSERT INTO "log_lines" VALUES(30,0,10,'2026-12-14T15:32:37Z ✔ install succeeded in 23s');
INSERT INTO "log_lines" VALUES(30,0,11,'2026-12-14T15:32:37Z ▶ lint started');
INSERT INTO "log_lines" VALUES(30,0,12,'2026-12-14T15:33:07Z ✔ lint succeeded in 30s');
INSERT INTO "log_lines" VALUES(30,0,13,'2026-12-14T15:33:10Z ▶ build started');
INSERT INTO "log_lines" VALUES(30,0,14,'2026-12-14T15:36:50Z ✔ build succeeded in 220s');
INSERT INTO "log_lines" VALUES(30,0,15,'2026-12-14T15:36:51Z ▶ test started');
INSERT INTO "log_lines" VALUES(30,0,16,'2026-12-14T15:39:24Z ✔ test succeeded in 153s');
INSERT INTO "log_lines" VALUES(30,0,17,'2026-12-14T15:39:26Z Run succeeded');
INSERT INTO "log_lines" VALUES(30,177,1,'Reading .knecht/workflows/ci.yml at c285a8c');
INSERT INTO "log_lines" VALUES(30,177,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(30,178,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(30,178,2,'HEAD is now at c285a8c on main');
INSERT INTO "log_lines" VALUES(30,179,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(30,179,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(30,179,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(30,180,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(30,180,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(30,181,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(30,181,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(30,181,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(30,181,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(30,181,5,'Connecting to postgres://fastcodec:rCaqx9vJupc94tnwla@db.internal:5432/fastcodec for migrations check… ok');
INSERT INTO "log_lines" VALUES(30,182,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(30,182,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(30,182,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(31,0,1,'2026-12-16T15:41:53Z Run #8 of ci (version 2) queued by anna.schmidt via pull_request');
INSERT INTO "log_lines" VALUES(31,0,2,'2026-12-16T15:41:53Z Repository storefront-web @ feature/checkout-v2 (d34979b3cbf9)');
INSERT INTO "log_lines" VALUES(31,0,3,'2026-12-16T15:42:58Z Picked up by runner knecht-runner-06');
INSERT INTO "log_lines" VALUES(31,0,4,'2026-12-16T15:42:58Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(31,0,5,'2026-12-16T15:42:58Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(31,0,6,'2026-12-16T15:43:00Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(31,0,7,'2026-12-16T15:43:02Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(31,0,8,'2026-12-16T15:43:06Z ✔ checkout succeeded in 4s');
INSERT INTO "log_lines" VALUES(31,0,9,'2026-12-16T15:43:08Z ▶ install started');
INSERT INTO "log_lines" VALUES(31,0,10,'2026-12-16T15:43:55Z ✔ install succeeded in 47s');
INSERT INTO "log_lines" VALUES(31,0,11,'2026-12-16T15:43:56Z ▶ lint started');
INSERT INTO "log_lines" VALUES(31,0,12,'2026-12-16T15:44:35Z ✔ lint succeeded in 39s');
INSERT INTO "log_lines" VALUES(31,0,13,'2026-12-16T15:44:36Z ▶ build started');
INSERT INTO "log_lines" VALUES(31,0,14,'2026-12-16T15:45:44Z ✔ build succeeded in 68s');
INSERT INTO "log_lines" VALUES(31,0,15,'2026-12-16T15:45:44Z ▶ test started');
INSERT INTO "log_lines" VALUES(31,0,16,'2026-12-16T15:55:06Z ✖ test cancelled in 562s');
INSERT INTO "log_lines" VALUES(31,0,17,'2026-12-16T15:55:06Z Run cancelled by tom.nguyen; remaining actions skipped');
INSERT INTO "log_lines" VALUES(31,183,1,'Reading .knecht/workflows/ci.yml at d34979b');
INSERT INTO "log_lines" VALUES(31,183,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(31,184,1,'$ git clone --depth 1 https://git.acme.internal/acme/storefront-web.git .');
INSERT INTO "log_lines" VALUES(31,184,2,'HEAD is now at d34979b on feature/checkout-v2');
INSERT INTO "log_lines" VALUES(31,185,1,'$ npm ci');
INSERT INTO "log_lines" VALUES(31,185,2,'added 1312 packages, and audited 1313 packages in 38s');
INSERT INTO "log_lines" VALUES(31,185,3,'214 packages are looking for funding');
INSERT INTO "log_lines" VALUES(31,185,4,'found 0 vulnerabilities');
INSERT INTO "log_lines" VALUES(31,186,1,'$ npm run lint && npm run typecheck');
INSERT INTO "log_lines" VALUES(31,186,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(31,187,1,'$ npm run build');
INSERT INTO "log_lines" VALUES(31,187,2,'vite v5.4.10 building for production...');
INSERT INTO "log_lines" VALUES(31,187,3,'✓ 1843 modules transformed.');
INSERT INTO "log_lines" VALUES(31,187,4,'dist/assets/index-5f2c9a1b.js   612.44 kB │ gzip: 187.02 kB');
INSERT INTO "log_lines" VALUES(31,187,5,'✓ built in 21.38s');
INSERT INTO "log_lines" VALUES(31,188,1,'$ npm test -- --ci --reporters=default');
INSERT INTO "log_lines" VALUES(31,188,2,'PASS src/cart/Cart.test.tsx');
INSERT INTO "log_lines" VALUES(32,0,1,'2026-12-18T00:48:07Z Run #5 of ci (version 2) queued by lukas.bauer via pull_request');
INSERT INTO "log_lines" VALUES(32,0,2,'2026-12-18T00:48:07Z Repository knecht-cli @ feature/status-watch (4360c66a4d9a)');
INSERT INTO "log_lines" VALUES(32,0,3,'2026-12-18T00:49:18Z Picked up by runner knecht-runner-08');
INSERT INTO "log_lines" VALUES(32,0,4,'2026-12-18T00:49:18Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(32,0,5,'2026-12-18T00:49:18Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(32,0,6,'2026-12-18T00:49:19Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(32,0,7,'2026-12-18T00:49:22Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(32,0,8,'2026-12-18T00:49:27Z ✔ checkout succeeded in 5s');
INSERT INTO "log_lines" VALUES(32,0,9,'2026-12-18T00:49:30Z ▶ install started');
INSERT INTO "log_lines" VALUES(32,0,10,'2026-12-18T00:50:06Z ✔ install succeeded in 36s');
INSERT INTO "log_lines" VALUES(32,0,11,'2026-12-18T00:50:06Z ▶ lint started');
INSERT INTO "log_lines" VALUES(32,0,12,'2026-12-18T00:50:36Z ✔ lint succeeded in 30s');
INSERT INTO "log_lines" VALUES(32,0,13,'2026-12-18T00:50:38Z ▶ build started');
INSERT INTO "log_lines" VALUES(32,0,14,'2026-12-18T00:53:31Z ✔ build succeeded in 173s');
INSERT INTO "log_lines" VALUES(32,0,15,'2026-12-18T00:53:34Z ▶ test started');
INSERT INTO "log_lines" VALUES(32,0,16,'2026-12-18T01:00:05Z ✔ test succeeded in 391s');
INSERT INTO "log_lines" VALUES(32,0,17,'2026-12-18T01:00:06Z Run succeeded');
INSERT INTO "log_lines" VALUES(32,189,1,'Reading .knecht/workflows/ci.yml at 4360c66');
INSERT INTO "log_lines" VALUES(32,189,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(32,190,1,'$ git clone --depth 1 https://git.acme.internal/acme/knecht-cli.git .');
INSERT INTO "log_lines" VALUES(32,190,2,'HEAD is now at 4360c66 on feature/status-watch');
INSERT INTO "log_lines" VALUES(32,191,1,'$ go mod download');
INSERT INTO "log_lines" VALUES(32,191,2,'go: downloading github.com/spf13/cobra v1.8.1');
INSERT INTO "log_lines" VALUES(32,191,3,'go: downloading github.com/charmbracelet/lipgloss v0.13.0');
INSERT INTO "log_lines" VALUES(32,191,4,'go: downloading golang.org/x/sync v0.8.0');
INSERT INTO "log_lines" VALUES(32,192,1,'$ go vet ./... && staticcheck ./...');
INSERT INTO "log_lines" VALUES(32,192,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(32,193,1,'$ go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli');
INSERT INTO "log_lines" VALUES(32,193,2,'building dist/knecht-cli for linux/amd64');
INSERT INTO "log_lines" VALUES(32,193,3,'dist/knecht-cli: 14.2 MB');
INSERT INTO "log_lines" VALUES(32,194,1,'$ go test -race ./...');
INSERT INTO "log_lines" VALUES(32,194,2,'ok  	github.com/acme/knecht-cli/internal/config	0.412s');
INSERT INTO "log_lines" VALUES(32,194,3,'ok  	github.com/acme/knecht-cli/internal/runner	2.873s');
INSERT INTO "log_lines" VALUES(32,194,4,'ok  	github.com/acme/knecht-cli/cmd/knecht-cli	1.104s');
INSERT INTO "log_lines" VALUES(33,0,1,'2026-12-19T15:47:48Z Run #8 of ci (version 2) queued by jonas.weber via push');
INSERT INTO "log_lines" VALUES(33,0,2,'2026-12-19T15:47:48Z Repository fastcodec @ fix/flaky-test (d3971494b402)');
INSERT INTO "log_lines" VALUES(33,0,3,'2026-12-19T15:48:09Z Picked up by runner knecht-runner-03');
INSERT INTO "log_lines" VALUES(33,0,4,'2026-12-19T15:48:09Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(33,0,5,'2026-12-19T15:48:09Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(33,0,6,'2026-12-19T15:48:10Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(33,0,7,'2026-12-19T15:48:11Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(33,0,8,'2026-12-19T15:48:18Z ✔ checkout succeeded in 7s');
INSERT INTO "log_lines" VALUES(33,0,9,'2026-12-19T15:48:20Z ▶ install started');
INSERT INTO "log_lines" VALUES(33,0,10,'2026-12-19T15:49:00Z ✔ install succeeded in 40s');
INSERT INTO "log_lines" VALUES(33,0,11,'2026-12-19T15:49:01Z ▶ lint started');
INSERT INTO "log_lines" VALUES(33,0,12,'2026-12-19T15:49:25Z ✔ lint succeeded in 24s');
INSERT INTO "log_lines" VALUES(33,0,13,'2026-12-19T15:49:25Z ▶ build started');
INSERT INTO "log_lines" VALUES(33,0,14,'2026-12-19T15:50:47Z ✔ build succeeded in 82s');
INSERT INTO "log_lines" VALUES(33,0,15,'2026-12-19T15:50:47Z ▶ test started');
INSERT INTO "log_lines" VALUES(33,0,16,'2026-12-19T15:55:07Z ✔ test succeeded in 260s');
INSERT INTO "log_lines" VALUES(33,0,17,'2026-12-19T15:55:10Z Run succeeded');
INSERT INTO "log_lines" VALUES(33,195,1,'Reading .knecht/workflows/ci.yml at d397149');
INSERT INTO "log_lines" VALUES(33,195,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(33,196,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(33,196,2,'HEAD is now at d397149 on fix/flaky-test');
INSERT INTO "log_lines" VALUES(33,197,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(33,197,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(33,197,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(33,198,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(33,198,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(33,199,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(33,199,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(33,199,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(33,199,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(33,200,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(33,200,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(33,200,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(34,0,1,'2026-12-21T23:25:04Z Run #9 of ci (version 2) queued by tom.nguyen via push');
INSERT INTO "log_lines" VALUES(34,0,2,'2026-12-21T23:25:04Z Repository fastcodec @ main (76c338fa636a)');
INSERT INTO "log_lines" VALUES(34,0,3,'2026-12-21T23:25:57Z Picked up by runner knecht-runner-11');
INSERT INTO "log_lines" VALUES(34,0,4,'2026-12-21T23:25:57Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(34,0,5,'2026-12-21T23:25:57Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(34,0,6,'2026-12-21T23:25:59Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(34,0,7,'2026-12-21T23:26:00Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(34,0,8,'2026-12-21T23:26:06Z ✔ checkout succeeded in 6s');
INSERT INTO "log_lines" VALUES(34,0,9,'2026-12-21T23:26:09Z ▶ install started');
INSERT INTO "log_lines" VALUES(34,0,10,'2026-12-21T23:26:31Z ✔ install succeeded in 22s');
INSERT INTO "log_lines" VALUES(34,0,11,'2026-12-21T23:26:34Z ▶ lint started');
INSERT INTO "log_lines" VALUES(34,0,12,'2026-12-21T23:26:42Z ✔ lint succeeded in 8s');
INSERT INTO "log_lines" VALUES(34,0,13,'2026-12-21T23:26:43Z ▶ build started');
INSERT INTO "log_lines" VALUES(34,0,14,'2026-12-21T23:29:13Z ✔ build succeeded in 150s');
INSERT INTO "log_lines" VALUES(34,0,15,'2026-12-21T23:29:16Z ▶ test started');
INSERT INTO "log_lines" VALUES(34,0,16,'2026-12-21T23:49:16Z ✖ test failed in 1200s (exit code 124)');
INSERT INTO "log_lines" VALUES(34,0,17,'2026-12-21T23:49:17Z Run failed: action ''test'' failed; remaining actions skipped');
INSERT INTO "log_lines" VALUES(34,201,1,'Reading .knecht/workflows/ci.yml at 76c338f');
INSERT INTO "log_lines" VALUES(34,201,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(34,202,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(34,202,2,'HEAD is now at 76c338f on main');
INSERT INTO "log_lines" VALUES(34,203,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(34,203,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(34,203,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(34,204,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(34,204,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(34,205,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(34,205,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(34,205,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(34,205,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(34,206,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(34,206,2,'warning: redis at redis.internal:6379 not reachable; tests fall back to retry loops');
INSERT INTO "log_lines" VALUES(34,206,3,'running 148 tests');
INSERT INTO "log_lines" VALUES(34,206,4,'waiting for lock on redis key ''webhook-retry'' (attempt 12)…');
INSERT INTO "log_lines" VALUES(34,206,5,'waiting for lock on redis key ''webhook-retry'' (attempt 13)…');
INSERT INTO "log_lines" VALUES(34,206,6,'Error: Action exceeded timeout of 20m; the process was terminated (exit code 124)');
INSERT INTO "log_lines" VALUES(35,0,1,'2026-12-22T06:32:03Z Run #5 of ci (version 2) queued by jonas.weber via pull_request');
INSERT INTO "log_lines" VALUES(35,0,2,'2026-12-22T06:32:03Z Repository payments-api @ fix/flaky-test (4003ff33280d)');
INSERT INTO "log_lines" VALUES(35,0,3,'2026-12-22T06:33:06Z Picked up by runner knecht-runner-09');
INSERT INTO "log_lines" VALUES(35,0,4,'2026-12-22T06:33:06Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(35,0,5,'2026-12-22T06:33:06Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(35,0,6,'2026-12-22T06:33:08Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(35,0,7,'2026-12-22T06:33:08Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(35,0,8,'2026-12-22T06:33:16Z ✔ checkout succeeded in 8s');
INSERT INTO "log_lines" VALUES(35,0,9,'2026-12-22T06:33:17Z ▶ install started');
INSERT INTO "log_lines" VALUES(35,0,10,'2026-12-22T06:34:18Z ✔ install succeeded in 61s');
INSERT INTO "log_lines" VALUES(35,0,11,'2026-12-22T06:34:21Z ▶ lint started');
INSERT INTO "log_lines" VALUES(35,0,12,'2026-12-22T06:35:00Z ✔ lint succeeded in 39s');
INSERT INTO "log_lines" VALUES(35,0,13,'2026-12-22T06:35:00Z ▶ build started');
INSERT INTO "log_lines" VALUES(35,0,14,'2026-12-22T06:35:49Z ✔ build succeeded in 49s');
INSERT INTO "log_lines" VALUES(35,0,15,'2026-12-22T06:35:50Z ▶ test started');
INSERT INTO "log_lines" VALUES(35,0,16,'2026-12-22T06:39:34Z ✔ test succeeded in 224s');
INSERT INTO "log_lines" VALUES(35,0,17,'2026-12-22T06:39:35Z Run succeeded');
INSERT INTO "log_lines" VALUES(35,207,1,'Reading .knecht/workflows/ci.yml at 4003ff3');
INSERT INTO "log_lines" VALUES(35,207,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(35,208,1,'$ git clone --depth 1 https://git.acme.internal/acme/payments-api.git .');
INSERT INTO "log_lines" VALUES(35,208,2,'HEAD is now at 4003ff3 on fix/flaky-test');
INSERT INTO "log_lines" VALUES(35,209,1,'$ pip install -r requirements.txt -r requirements-dev.txt');
INSERT INTO "log_lines" VALUES(35,209,2,'Collecting fastapi==0.115.4');
INSERT INTO "log_lines" VALUES(35,209,3,'Collecting sqlalchemy==2.0.36');
INSERT INTO "log_lines" VALUES(35,209,4,'Collecting psycopg[binary]==3.2.3');
INSERT INTO "log_lines" VALUES(35,209,5,'Installing collected packages: typing-extensions, pydantic-core, pydantic, starlette, fastapi');
INSERT INTO "log_lines" VALUES(35,209,6,'Successfully installed 47 packages');
INSERT INTO "log_lines" VALUES(35,210,1,'$ ruff check . && mypy app');
INSERT INTO "log_lines" VALUES(35,210,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(35,211,1,'$ docker build -t registry.internal/payments-api:4003ff3 .');
INSERT INTO "log_lines" VALUES(35,211,2,'#5 [2/6] COPY requirements.txt .');
INSERT INTO "log_lines" VALUES(35,211,3,'#6 [3/6] RUN pip install --no-cache-dir -r requirements.txt');
INSERT INTO "log_lines" VALUES(35,211,4,'#9 exporting to image');
INSERT INTO "log_lines" VALUES(35,211,5,'#9 naming to registry.internal/payments-api:4003ff3 done');
INSERT INTO "log_lines" VALUES(35,212,1,'$ pytest -q --maxfail=1');
INSERT INTO "log_lines" VALUES(35,212,2,'============================= test session starts ==============================');
INSERT INTO "log_lines" VALUES(35,212,3,'collected 312 items');
INSERT INTO "log_lines" VALUES(35,212,4,'tests/test_api.py ........................................................ [ 18%]');
INSERT INTO "log_lines" VALUES(35,212,5,'tests/test_payments.py ................................................... [ 61%]');
INSERT INTO "log_lines" VALUES(35,212,6,'tests/test_webhooks.py ................................................... [100%]');
INSERT INTO "log_lines" VALUES(35,212,7,'======================= 312 passed in 41.27s ===================================');
INSERT INTO "log_lines" VALUES(36,0,1,'2026-12-24T00:32:07Z Run #10 of ci (version 2) queued by lukas.bauer via rerun (rerun of run 34)');
INSERT INTO "log_lines" VALUES(36,0,2,'2026-12-24T00:32:07Z Repository fastcodec @ main (76c338fa636a)');
INSERT INTO "log_lines" VALUES(36,0,3,'2026-12-24T00:32:56Z Picked up by runner knecht-runner-02');
INSERT INTO "log_lines" VALUES(36,0,4,'2026-12-24T00:32:56Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(36,0,5,'2026-12-24T00:32:56Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(36,0,6,'2026-12-24T00:32:58Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(36,0,7,'2026-12-24T00:33:01Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(36,0,8,'2026-12-24T00:33:10Z ✔ checkout succeeded in 9s');
INSERT INTO "log_lines" VALUES(36,0,9,'2026-12-24T00:33:11Z ▶ install started');
INSERT INTO "log_lines" VALUES(36,0,10,'2026-12-24T00:33:54Z ✔ install succeeded in 43s');
INSERT INTO "log_lines" VALUES(36,0,11,'2026-12-24T00:33:54Z ▶ lint started');
INSERT INTO "log_lines" VALUES(36,0,12,'2026-12-24T00:34:24Z ✔ lint succeeded in 30s');
INSERT INTO "log_lines" VALUES(36,0,13,'2026-12-24T00:34:24Z ▶ build started');
INSERT INTO "log_lines" VALUES(36,0,14,'2026-12-24T00:36:08Z ✔ build succeeded in 104s');
INSERT INTO "log_lines" VALUES(36,0,15,'2026-12-24T00:36:11Z ▶ test started');
INSERT INTO "log_lines" VALUES(36,0,16,'2026-12-24T00:38:13Z ✔ test succeeded in 122s');
INSERT INTO "log_lines" VALUES(36,0,17,'2026-12-24T00:38:13Z Run succeeded');
INSERT INTO "log_lines" VALUES(36,213,1,'Reading .knecht/workflows/ci.yml at 76c338f');
INSERT INTO "log_lines" VALUES(36,213,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(36,214,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(36,214,2,'HEAD is now at 76c338f on main');
INSERT INTO "log_lines" VALUES(36,215,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(36,215,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(36,215,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(36,216,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(36,216,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(36,217,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(36,217,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(36,217,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(36,217,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(36,218,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(36,218,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(36,218,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(37,0,1,'2026-12-25T15:04:08Z Run #6 of ci (version 2) queued by jonas.weber via push');
INSERT INTO "log_lines" VALUES(37,0,2,'2026-12-25T15:04:08Z Repository knecht-cli @ main (f8b44bc286ee)');
INSERT INTO "log_lines" VALUES(37,0,3,'2026-12-25T15:05:00Z Picked up by runner knecht-runner-09');
INSERT INTO "log_lines" VALUES(37,0,4,'2026-12-25T15:05:00Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(37,0,5,'2026-12-25T15:05:00Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(37,0,6,'2026-12-25T15:05:02Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(37,0,7,'2026-12-25T15:05:03Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(37,0,8,'2026-12-25T15:05:07Z ✔ checkout succeeded in 4s');
INSERT INTO "log_lines" VALUES(37,0,9,'2026-12-25T15:05:08Z ▶ install started');
INSERT INTO "log_lines" VALUES(37,0,10,'2026-12-25T15:05:36Z ✔ install succeeded in 28s');
INSERT INTO "log_lines" VALUES(37,0,11,'2026-12-25T15:05:37Z ▶ lint started');
INSERT INTO "log_lines" VALUES(37,0,12,'2026-12-25T15:06:15Z ✔ lint succeeded in 38s');
INSERT INTO "log_lines" VALUES(37,0,13,'2026-12-25T15:06:16Z ▶ build started');
INSERT INTO "log_lines" VALUES(37,0,14,'2026-12-25T15:07:33Z ✔ build succeeded in 77s');
INSERT INTO "log_lines" VALUES(37,0,15,'2026-12-25T15:07:36Z ▶ test started');
INSERT INTO "log_lines" VALUES(37,0,16,'2026-12-25T15:16:35Z ✔ test succeeded in 539s');
INSERT INTO "log_lines" VALUES(37,0,17,'2026-12-25T15:16:37Z Run succeeded');
INSERT INTO "log_lines" VALUES(37,219,1,'Reading .knecht/workflows/ci.yml at f8b44bc');
INSERT INTO "log_lines" VALUES(37,219,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(37,220,1,'$ git clone --depth 1 https://git.acme.internal/acme/knecht-cli.git .');
INSERT INTO "log_lines" VALUES(37,220,2,'HEAD is now at f8b44bc on main');
INSERT INTO "log_lines" VALUES(37,221,1,'$ go mod download');
INSERT INTO "log_lines" VALUES(37,221,2,'go: downloading github.com/spf13/cobra v1.8.1');
INSERT INTO "log_lines" VALUES(37,221,3,'go: downloading github.com/charmbracelet/lipgloss v0.13.0');
INSERT INTO "log_lines" VALUES(37,221,4,'go: downloading golang.org/x/sync v0.8.0');
INSERT INTO "log_lines" VALUES(37,222,1,'$ go vet ./... && staticcheck ./...');
INSERT INTO "log_lines" VALUES(37,222,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(37,223,1,'$ go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli');
INSERT INTO "log_lines" VALUES(37,223,2,'building dist/knecht-cli for linux/amd64');
INSERT INTO "log_lines" VALUES(37,223,3,'dist/knecht-cli: 14.2 MB');
INSERT INTO "log_lines" VALUES(37,224,1,'$ go test -race ./...');
INSERT INTO "log_lines" VALUES(37,224,2,'ok  	github.com/acme/knecht-cli/internal/config	0.412s');
INSERT INTO "log_lines" VALUES(37,224,3,'ok  	github.com/acme/knecht-cli/internal/runner	2.873s');
INSERT INTO "log_lines" VALUES(37,224,4,'ok  	github.com/acme/knecht-cli/cmd/knecht-cli	1.104s');
INSERT INTO "log_lines" VALUES(38,0,1,'2026-12-27T11:23:09Z Run #11 of ci (version 2) queued by mei.chen via pull_request');
INSERT INTO "log_lines" VALUES(38,0,2,'2026-12-27T11:23:09Z Repository fastcodec @ feature/simd-decode (adc70e946d15)');
INSERT INTO "log_lines" VALUES(38,0,3,'2026-12-27T11:23:11Z Picked up by runner knecht-runner-07');
INSERT INTO "log_lines" VALUES(38,0,4,'2026-12-27T11:23:11Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(38,0,5,'2026-12-27T11:23:11Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(38,0,6,'2026-12-27T11:23:13Z ✔ parse-workflow succeeded in 2s');
INSERT INTO "log_lines" VALUES(38,0,7,'2026-12-27T11:23:14Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(38,0,8,'2026-12-27T11:23:20Z ✔ checkout succeeded in 6s');
INSERT INTO "log_lines" VALUES(38,0,9,'2026-12-27T11:23:22Z ▶ install started');
INSERT INTO "log_lines" VALUES(38,0,10,'2026-12-27T11:24:43Z ✔ install succeeded in 81s');
INSERT INTO "log_lines" VALUES(38,0,11,'2026-12-27T11:24:43Z ▶ lint started');
INSERT INTO "log_lines" VALUES(38,0,12,'2026-12-27T11:25:14Z ✖ lint cancelled in 31s');
INSERT INTO "log_lines" VALUES(38,0,13,'2026-12-27T11:25:15Z Run cancelled by mei.chen; remaining actions skipped');
INSERT INTO "log_lines" VALUES(38,225,1,'Reading .knecht/workflows/ci.yml at adc70e9');
INSERT INTO "log_lines" VALUES(38,225,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(38,226,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(38,226,2,'HEAD is now at adc70e9 on feature/simd-decode');
INSERT INTO "log_lines" VALUES(38,227,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(38,227,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(38,227,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(38,228,1,'$ cargo clippy --all-targets -- -D warnings');
INSERT INTO "log_lines" VALUES(38,228,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(39,0,1,'2026-12-28T02:03:15Z Run #1 of nightly (version 3) queued by knecht-scheduler via schedule');
INSERT INTO "log_lines" VALUES(39,0,2,'2026-12-28T02:03:15Z Repository fastcodec @ main (a216ed03585b)');
INSERT INTO "log_lines" VALUES(39,0,3,'2026-12-28T02:04:41Z Picked up by runner knecht-runner-09');
INSERT INTO "log_lines" VALUES(39,0,4,'2026-12-28T02:04:41Z Inputs: {"suite": "full"}');
INSERT INTO "log_lines" VALUES(39,0,5,'2026-12-28T02:04:41Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(39,0,6,'2026-12-28T02:04:42Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(39,0,7,'2026-12-28T02:04:43Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(39,0,8,'2026-12-28T02:04:46Z ✔ checkout succeeded in 3s');
INSERT INTO "log_lines" VALUES(39,0,9,'2026-12-28T02:04:48Z ▶ install started');
INSERT INTO "log_lines" VALUES(39,0,10,'2026-12-28T02:05:40Z ✔ install succeeded in 52s');
INSERT INTO "log_lines" VALUES(39,0,11,'2026-12-28T02:05:41Z ▶ build started');
INSERT INTO "log_lines" VALUES(39,0,12,'2026-12-28T02:07:20Z ✔ build succeeded in 99s');
INSERT INTO "log_lines" VALUES(39,0,13,'2026-12-28T02:07:23Z ▶ test started');
INSERT INTO "log_lines" VALUES(39,0,14,'2026-12-28T02:14:17Z ✔ test succeeded in 414s');
INSERT INTO "log_lines" VALUES(39,0,15,'2026-12-28T02:14:18Z ▶ report started');
INSERT INTO "log_lines" VALUES(39,0,16,'2026-12-28T02:14:24Z ✔ report succeeded in 6s');
INSERT INTO "log_lines" VALUES(39,0,17,'2026-12-28T02:14:27Z Run succeeded');
INSERT INTO "log_lines" VALUES(39,231,1,'Reading .knecht/workflows/nightly.yml at a216ed0');
INSERT INTO "log_lines" VALUES(39,231,2,'Workflow nightly: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(39,232,1,'$ git clone --depth 1 https://git.acme.internal/acme/fastcodec.git .');
INSERT INTO "log_lines" VALUES(39,232,2,'HEAD is now at a216ed0 on main');
INSERT INTO "log_lines" VALUES(39,233,1,'$ cargo fetch --locked');
INSERT INTO "log_lines" VALUES(39,233,2,'    Updating crates.io index');
INSERT INTO "log_lines" VALUES(39,233,3,'  Downloaded 86 crates (7.9 MB) in 2.31s');
INSERT INTO "log_lines" VALUES(39,234,1,'$ cargo build --release');
INSERT INTO "log_lines" VALUES(39,234,2,'   Compiling serde v1.0.214');
INSERT INTO "log_lines" VALUES(39,234,3,'   Compiling fastcodec v0.7.2 (/workspace)');
INSERT INTO "log_lines" VALUES(39,234,4,'    Finished `release` profile [optimized] target(s) in 1m 12s');
INSERT INTO "log_lines" VALUES(39,235,1,'$ cargo test --release');
INSERT INTO "log_lines" VALUES(39,235,2,'running 148 tests');
INSERT INTO "log_lines" VALUES(39,235,3,'test result: ok. 148 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.41s');
INSERT INTO "log_lines" VALUES(39,236,1,'$ knecht report --format junit results/*.xml');
INSERT INTO "log_lines" VALUES(39,236,2,'Report uploaded: 1 file');
INSERT INTO "log_lines" VALUES(40,0,1,'2026-12-29T18:02:41Z Run #4 of ci (version 2) queued by sara.okafor via pull_request');
INSERT INTO "log_lines" VALUES(40,0,2,'2026-12-29T18:02:41Z Repository infra-live @ fix/timeouts (b15adcf27e95)');
INSERT INTO "log_lines" VALUES(40,0,3,'2026-12-29T18:03:10Z Picked up by runner knecht-runner-12');
INSERT INTO "log_lines" VALUES(40,0,4,'2026-12-29T18:03:10Z Inputs: {"log_level": "info", "run_slow_tests": false}');
INSERT INTO "log_lines" VALUES(40,0,5,'2026-12-29T18:03:10Z ▶ parse-workflow started');
INSERT INTO "log_lines" VALUES(40,0,6,'2026-12-29T18:03:11Z ✔ parse-workflow succeeded in 1s');
INSERT INTO "log_lines" VALUES(40,0,7,'2026-12-29T18:03:14Z ▶ checkout started');
INSERT INTO "log_lines" VALUES(40,0,8,'2026-12-29T18:03:17Z ✔ checkout succeeded in 3s');
INSERT INTO "log_lines" VALUES(40,0,9,'2026-12-29T18:03:17Z ▶ install started');
INSERT INTO "log_lines" VALUES(40,0,10,'2026-12-29T18:04:10Z ✔ install succeeded in 53s');
INSERT INTO "log_lines" VALUES(40,0,11,'2026-12-29T18:04:11Z ▶ lint started');
INSERT INTO "log_lines" VALUES(40,0,12,'2026-12-29T18:04:49Z ✔ lint succeeded in 38s');
INSERT INTO "log_lines" VALUES(40,0,13,'2026-12-29T18:04:52Z ▶ build started');
INSERT INTO "log_lines" VALUES(40,0,14,'2026-12-29T18:07:54Z ✔ build succeeded in 182s');
INSERT INTO "log_lines" VALUES(40,0,15,'2026-12-29T18:07:57Z ▶ test started');
INSERT INTO "log_lines" VALUES(40,237,1,'Reading .knecht/workflows/ci.yml at b15adcf');
INSERT INTO "log_lines" VALUES(40,237,2,'Workflow ci: 5 actions, inputs validated');
INSERT INTO "log_lines" VALUES(40,238,1,'$ git clone --depth 1 https://git.acme.internal/acme/infra-live.git .');
INSERT INTO "log_lines" VALUES(40,238,2,'HEAD is now at b15adcf on fix/timeouts');
INSERT INTO "log_lines" VALUES(40,239,1,'$ terraform init -input=false');
INSERT INTO "log_lines" VALUES(40,239,2,'Initializing the backend...');
INSERT INTO "log_lines" VALUES(40,239,3,'Initializing provider plugins...');
INSERT INTO "log_lines" VALUES(40,239,4,'- Installing hashicorp/aws v5.74.0...');
INSERT INTO "log_lines" VALUES(40,239,5,'Terraform has been successfully initialized!');
INSERT INTO "log_lines" VALUES(40,240,1,'$ terraform fmt -check -recursive && tflint');
INSERT INTO "log_lines" VALUES(40,240,2,'All checks passed.');
INSERT INTO "log_lines" VALUES(40,241,1,'$ terraform plan -out=plan.tfplan');
INSERT INTO "log_lines" VALUES(40,241,2,'Refreshing state... [id=vpc-0a1b2c3d]');
INSERT INTO "log_lines" VALUES(40,241,3,'Plan: 3 to add, 1 to change, 0 to destroy.');
INSERT INTO "log_lines" VALUES(40,242,1,'$ go test ./test/... -timeout 30m');
INSERT INTO "log_lines" VALUES(40,242,2,'--- PASS: TestVpcModule (84.20s)');
INSERT INTO "log_lines" VALUES(41,0,1,'2026-12-01T09:46:05Z Run #9 of ci (version 3) queued by alice via rerun (rerun of run 3)');
INSERT INTO "log_lines" VALUES(41,0,2,'2026-12-01T09:46:05Z Repository @ feature/checkout-v2 (73f6e53d3853)');
CREATE TABLE project_variables (
    project_id INTEGER NOT NULL REFERENCES projects(id),
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    secret     INTEGER NOT NULL DEFAULT 0,
    updated_at TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (project_id, name)
);
INSERT INTO "project_variables" VALUES(1,'AWS_ACCESS_KEY_ID','AKIAHODZDOC9IS0J8HT9',1,'2025-11-06T00:00:00Z','sara.okafor');
INSERT INTO "project_variables" VALUES(1,'AWS_SECRET_ACCESS_KEY','xnyVmihA+2O76UMFxFkM+R5Kjp1vRt/1fjORS+6i',1,'2025-11-06T00:00:00Z','mei.chen');
INSERT INTO "project_variables" VALUES(1,'DEPLOY_TOKEN','ghp_1f8rESQedUStPKR0CsTy4Qwb8DwkNhFdnXsi',1,'2025-11-06T00:00:00Z','tom.nguyen');
INSERT INTO "project_variables" VALUES(1,'DATABASE_URL','postgres://payments_api:Vpzz63FfkCzJr4i0B3@db.internal:5432/payments_api',1,'2025-11-06T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(1,'LOG_LEVEL','info',0,'2025-11-04T00:00:00Z','mei.chen');
INSERT INTO "project_variables" VALUES(1,'REGION','eu-central-1',0,'2025-11-04T00:00:00Z','tom.nguyen');
INSERT INTO "project_variables" VALUES(1,'ARTIFACT_BUCKET','acme-payments-api-artifacts',0,'2025-11-04T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(2,'AWS_ACCESS_KEY_ID','AKIA9ZZZZG4ZDMEN2KHV',1,'2025-12-13T00:00:00Z','sara.okafor');
INSERT INTO "project_variables" VALUES(2,'AWS_SECRET_ACCESS_KEY','gnatmUdjAWtGSU8po/799NksnRH9ucAUsdMlHUvT',1,'2025-12-13T00:00:00Z','sara.okafor');
INSERT INTO "project_variables" VALUES(2,'DEPLOY_TOKEN','ghp_XoIIXGvOoNZYW2mZp0zVZomHFwUbbYrEqmSM',1,'2025-12-13T00:00:00Z','anna.schmidt');
INSERT INTO "project_variables" VALUES(2,'DATABASE_URL','postgres://knecht_cli:9wCZ7Uw9xfogoEmvnE@db.internal:5432/knecht_cli',1,'2025-12-13T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(2,'LOG_LEVEL','info',0,'2025-12-11T00:00:00Z','tom.nguyen');
INSERT INTO "project_variables" VALUES(2,'REGION','eu-central-1',0,'2025-12-11T00:00:00Z','mei.chen');
INSERT INTO "project_variables" VALUES(2,'ARTIFACT_BUCKET','acme-knecht-cli-artifacts',0,'2025-12-11T00:00:00Z','tom.nguyen');
INSERT INTO "project_variables" VALUES(3,'AWS_ACCESS_KEY_ID','AKIAAG7I1MNBQNS6PUQ8',1,'2026-01-19T00:00:00Z','anna.schmidt');
INSERT INTO "project_variables" VALUES(3,'AWS_SECRET_ACCESS_KEY','1qhT61qtc4xatws8phP9nhFyJfm5di4PzJ59FHz5',1,'2026-01-19T00:00:00Z','mei.chen');
INSERT INTO "project_variables" VALUES(3,'DEPLOY_TOKEN','ghp_iAhzCueQpBenQtYh5Xj8TPQxjq4i9DoV8gz4',1,'2026-01-19T00:00:00Z','sara.okafor');
INSERT INTO "project_variables" VALUES(3,'DATABASE_URL','postgres://storefront_web:FkQ1okTBGzvAmwufUx@db.internal:5432/storefront_web',1,'2026-01-19T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(3,'LOG_LEVEL','info',0,'2026-01-17T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(3,'REGION','eu-central-1',0,'2026-01-17T00:00:00Z','tom.nguyen');
INSERT INTO "project_variables" VALUES(3,'ARTIFACT_BUCKET','acme-storefront-web-artifacts',0,'2026-01-17T00:00:00Z','anna.schmidt');
INSERT INTO "project_variables" VALUES(4,'AWS_ACCESS_KEY_ID','AKIAUFRDL1ERBFQFOEQH',1,'2026-02-25T00:00:00Z','mei.chen');
INSERT INTO "project_variables" VALUES(4,'AWS_SECRET_ACCESS_KEY','6bR1IqfEouHgxzNNAL5wIScGebcy8F5n3+YNBDRz',1,'2026-02-25T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(4,'DEPLOY_TOKEN','ghp_14TUOizwd1iaeOV4qBkdfQ1y3GQsMpSscDlk',1,'2026-02-25T00:00:00Z','anna.schmidt');
INSERT INTO "project_variables" VALUES(4,'DATABASE_URL','postgres://fastcodec:rCaqx9vJupc94tnwla@db.internal:5432/fastcodec',1,'2026-02-25T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(4,'LOG_LEVEL','info',0,'2026-02-23T00:00:00Z','mei.chen');
INSERT INTO "project_variables" VALUES(4,'REGION','eu-central-1',0,'2026-02-23T00:00:00Z','sara.okafor');
INSERT INTO "project_variables" VALUES(4,'ARTIFACT_BUCKET','acme-fastcodec-artifacts',0,'2026-02-23T00:00:00Z','tom.nguyen');
INSERT INTO "project_variables" VALUES(5,'AWS_ACCESS_KEY_ID','AKIA5JSJC616I76BOFBC',1,'2026-04-03T00:00:00Z','anna.schmidt');
INSERT INTO "project_variables" VALUES(5,'AWS_SECRET_ACCESS_KEY','rUnW5gcF/Ha6ili8GjHEAD6+Wj9KfzjsQGMrb9h/',1,'2026-04-03T00:00:00Z','tom.nguyen');
INSERT INTO "project_variables" VALUES(5,'DEPLOY_TOKEN','ghp_rRgSnRFsTHsDDDXh5Jmtf7EbsDe0G9Cryn68',1,'2026-04-03T00:00:00Z','mei.chen');
INSERT INTO "project_variables" VALUES(5,'DATABASE_URL','postgres://infra_live:7neLfjVHq8xiM0OGr4@db.internal:5432/infra_live',1,'2026-04-03T00:00:00Z','jonas.weber');
INSERT INTO "project_variables" VALUES(5,'LOG_LEVEL','info',0,'2026-04-01T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(5,'REGION','eu-central-1',0,'2026-04-01T00:00:00Z','lukas.bauer');
INSERT INTO "project_variables" VALUES(5,'ARTIFACT_BUCKET','acme-infra-live-artifacts',0,'2026-04-01T00:00:00Z','lukas.bauer');
CREATE TABLE projects (
    id             INTEGER PRIMARY KEY,
    slug           TEXT NOT NULL UNIQUE,
    name           TEXT NOT NULL,
    description    TEXT NOT NULL DEFAULT '',
    repository_url TEXT NOT NULL DEFAULT '',
    default_branch TEXT NOT NULL DEFAULT 'main',
    created_at     TEXT NOT NULL
);
INSERT INTO "projects" VALUES(1,'payments-api','Payments API','Python/FastAPI service that takes payments and refunds; deployed to Kubernetes.','https://git.acme.internal/acme/payments-api.git','main','2025-11-03T00:00:00Z');
INSERT INTO "projects" VALUES(2,'knecht-cli','Knecht CLI','Go command-line client for the Knecht API.','https://git.acme.internal/acme/knecht-cli.git','main','2025-12-10T00:00:00Z');
INSERT INTO "projects" VALUES(3,'storefront-web','Storefront Web','React/Vite storefront single-page app served from S3.','https://git.acme.internal/acme/storefront-web.git','main','2026-01-16T00:00:00Z');
INSERT INTO "projects" VALUES(4,'fastcodec','fastcodec','Rust library for a zero-copy binary frame codec, published to crates.io.','https://git.acme.internal/acme/fastcodec.git','main','2026-02-22T00:00:00Z');
INSERT INTO "projects" VALUES(5,'infra-live','Infrastructure (live)','Terraform for the AWS accounts: VPCs, ALBs, RDS.','https://git.acme.internal/acme/infra-live.git','main','2026-03-31T00:00:00Z');
CREATE TABLE proposals (
    id               INTEGER PRIMARY KEY,
    tool             TEXT NOT NULL,
    action           TEXT,
    arguments_json   TEXT NOT NULL,
    arguments_hash   TEXT NOT NULL,
    proposer_subject TEXT NOT NULL,
    proposer_client  TEXT NOT NULL,
    proposer_scopes  TEXT NOT NULL,
    rule             TEXT NOT NULL,
    preview_json     TEXT,
    status           TEXT NOT NULL CHECK (status IN
                         ('pending', 'approved', 'executing', 'succeeded', 'failed', 'rejected', 'expired')),
    created_at       TEXT NOT NULL,
    expires_at       TEXT NOT NULL,
    decided_by       TEXT,
    decided_at       TEXT,
    reason           TEXT,
    started_at       TEXT,
    finished_at      TEXT,
    result_json      TEXT,
    error            TEXT
, arguments_shown TEXT);
INSERT INTO "proposals" VALUES(1,'rerun_run',NULL,'{"commit_sha":"73f6e53d3853933d8ce621ef7f405bc8cfd3dd72","ref":"same_commit","run_id":3}','329a8f9dd5ec4b320f681394da877175463a19f0621b6050f71fcf103fae1267','alice','fixture','logs:read projects:read proposals:read runs:read runs:write variables:read variables:write workflows:read workflows:write','built-in: write effects are approve','{"run": {"id": 3, "number": 1, "project": "storefront-web", "workflow": "ci", "workflow_version": 1, "status": "succeeded", "trigger": "pull_request", "branch": "feature/checkout-v2", "commit_sha": "73f6e53d3853933d8ce621ef7f405bc8cfd3dd72", "created_by": "jonas.weber", "queued_at": "2026-11-04T17:23:40Z", "started_at": "2026-11-04T17:24:39Z", "finished_at": "2026-11-04T17:29:26Z", "rerun_of": null}, "will_run": {"branch": "feature/checkout-v2", "commit_sha": "73f6e53d3853933d8ce621ef7f405bc8cfd3dd72", "ref": "same_commit"}}','succeeded','2026-12-01T09:46:05.688187Z','2026-12-02T09:46:05.688187Z','bob','2026-12-01T09:46:05.692542Z',NULL,'2026-12-01T09:46:05.694125Z','2026-12-01T09:46:05.697089Z','{"run": {"id": 41, "number": 9, "project": "storefront-web", "workflow": "ci", "workflow_version": 3, "status": "queued", "trigger": "rerun", "branch": "feature/checkout-v2", "commit_sha": "73f6e53d3853933d8ce621ef7f405bc8cfd3dd72", "created_by": "alice", "queued_at": "2026-12-01T09:46:05Z", "started_at": null, "finished_at": null, "rerun_of": 3}, "next": "Follow it with get_run(run_id=41)."}',NULL,'{"commit_sha":"73f6e53d3853933d8ce621ef7f405bc8cfd3dd72","ref":"same_commit","run_id":3}');
INSERT INTO "proposals" VALUES(2,'rerun_run',NULL,'{"commit_sha":"877b55cb80de8b3eafcf0e77203943f65c327a6d","ref":"same_commit","run_id":4}','7859fa85aef37dfc46f0da5a0bdee21d2c301fa76cbffe8663fc0f4a25eac86c','alice','fixture','logs:read projects:read proposals:read runs:read runs:write variables:read variables:write workflows:read workflows:write','built-in: write effects are approve','{"run": {"id": 4, "number": 2, "project": "storefront-web", "workflow": "ci", "workflow_version": 1, "status": "succeeded", "trigger": "push", "branch": "main", "commit_sha": "877b55cb80de8b3eafcf0e77203943f65c327a6d", "created_by": "mei.chen", "queued_at": "2026-11-06T02:53:59Z", "started_at": "2026-11-06T02:54:28Z", "finished_at": "2026-11-06T03:06:56Z", "rerun_of": null}, "will_run": {"branch": "main", "commit_sha": "877b55cb80de8b3eafcf0e77203943f65c327a6d", "ref": "same_commit"}}','rejected','2026-12-01T09:46:05.690076Z','2026-12-02T09:46:05.690076Z','bob','2026-12-01T09:46:05.699443Z','not now',NULL,NULL,NULL,NULL,'{"commit_sha":"877b55cb80de8b3eafcf0e77203943f65c327a6d","ref":"same_commit","run_id":4}');
INSERT INTO "proposals" VALUES(3,'project_variable','set','{"action":"set","name":"NEW_TOKEN","project":"payments-api","secret":true,"value":"s3cret-value-123"}','21cda7946f39d2a28ebbc70eff611855a46d75f568e2819c74c576ee105d3dff','alice','fixture','logs:read projects:read proposals:read runs:read runs:write variables:read variables:write workflows:read workflows:write','built-in: write effects are approve','{"project": "payments-api", "name": "NEW_TOKEN", "action": "set", "current": null, "new": {"secret": true, "value": "(secret: *** value is never shown)"}}','pending','2026-12-01T09:46:05.691344Z','2026-12-02T09:46:05.691344Z',NULL,NULL,NULL,NULL,NULL,NULL,NULL,'{"action":"set","name":"NEW_TOKEN","project":"payments-api","secret":true,"value":"***"}');
CREATE TABLE runs (
    id               INTEGER PRIMARY KEY,
    project_id       INTEGER NOT NULL REFERENCES projects(id),
    workflow_id      INTEGER NOT NULL REFERENCES workflows(id),
    workflow_version INTEGER NOT NULL,
    number           INTEGER NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    trigger          TEXT NOT NULL CHECK (trigger IN ('push', 'pull_request', 'schedule', 'manual', 'rerun')),
    branch           TEXT NOT NULL,
    commit_sha       TEXT NOT NULL,
    inputs_json      TEXT NOT NULL DEFAULT '{}',
    created_by       TEXT NOT NULL,
    queued_at        TEXT NOT NULL,
    started_at       TEXT,
    finished_at      TEXT,
    rerun_of         INTEGER REFERENCES runs(id)
);
INSERT INTO "runs" VALUES(1,4,10,1,1,'succeeded','pull_request','fix/flaky-test','64950dc210a25b195f49f0fc40d284064a327e2d','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-11-02T03:01:35Z','2026-11-02T03:02:52Z','2026-11-02T03:15:29Z',NULL);
INSERT INTO "runs" VALUES(2,4,10,1,2,'succeeded','push','feature/no-std','bb7b738eeef795cd0caa761214a0b00bb835e8a5','{"log_level": "info", "run_slow_tests": false}','sara.okafor','2026-11-03T15:50:04Z','2026-11-03T15:51:24Z','2026-11-03T16:03:35Z',NULL);
INSERT INTO "runs" VALUES(3,3,7,1,1,'succeeded','pull_request','feature/checkout-v2','73f6e53d3853933d8ce621ef7f405bc8cfd3dd72','{"log_level": "info", "run_slow_tests": false}','jonas.weber','2026-11-04T17:23:40Z','2026-11-04T17:24:39Z','2026-11-04T17:29:26Z',NULL);
INSERT INTO "runs" VALUES(4,3,7,1,2,'succeeded','push','main','877b55cb80de8b3eafcf0e77203943f65c327a6d','{"log_level": "info", "run_slow_tests": false}','mei.chen','2026-11-06T02:53:59Z','2026-11-06T02:54:28Z','2026-11-06T03:06:56Z',NULL);
INSERT INTO "runs" VALUES(5,5,14,1,1,'succeeded','push','main','85b9c09a26edf1bd27855798394afbe91bea705e','{"dry_run": false, "environment": "production", "version": "v1.0.1"}','lukas.bauer','2026-11-07T14:05:41Z','2026-11-07T14:07:05Z','2026-11-07T14:17:52Z',NULL);
INSERT INTO "runs" VALUES(6,4,10,1,3,'succeeded','push','feature/no-std','3c19c31586ba22dd79ad89993e0b25cde23f03cc','{"log_level": "info", "run_slow_tests": false}','mei.chen','2026-11-08T21:23:30Z','2026-11-08T21:23:35Z','2026-11-08T21:31:18Z',NULL);
INSERT INTO "runs" VALUES(7,3,7,1,3,'cancelled','push','main','f848a9567ee5e85734893498114340ff813fb5cd','{"log_level": "info", "run_slow_tests": false}','mei.chen','2026-11-11T01:02:58Z','2026-11-11T01:03:24Z','2026-11-11T01:04:11Z',NULL);
INSERT INTO "runs" VALUES(8,3,9,1,1,'succeeded','schedule','main','20859634fe3c9c8f2b855c1f28aaca51b98c67c2','{"suite": "full"}','knecht-scheduler','2026-11-12T20:16:23Z','2026-11-12T20:17:15Z','2026-11-12T20:23:04Z',NULL);
INSERT INTO "runs" VALUES(9,5,13,1,1,'succeeded','push','feature/alb-waf','1407ab3300bc22cb1be4a5db2b54af7771436e1d','{"log_level": "info", "run_slow_tests": false}','mei.chen','2026-11-13T06:40:42Z','2026-11-13T06:41:28Z','2026-11-13T06:51:37Z',NULL);
INSERT INTO "runs" VALUES(10,4,10,1,4,'succeeded','pull_request','feature/simd-decode','10053d2c76cc057308ec379a602533dc0a68013d','{"log_level": "info", "run_slow_tests": false}','tom.nguyen','2026-11-14T23:38:20Z','2026-11-14T23:38:29Z','2026-11-14T23:43:24Z',NULL);
INSERT INTO "runs" VALUES(11,5,15,2,1,'failed','schedule','main','7e544d56d096bfd66e106c0ee9de047940449aa0','{"suite": "full"}','knecht-scheduler','2026-11-16T17:06:24Z','2026-11-16T17:07:29Z','2026-11-16T17:20:51Z',NULL);
INSERT INTO "runs" VALUES(12,3,7,1,4,'cancelled','push','main','15866ffb9fe5e39943cfeadf1279688cfce205cd','{"log_level": "info", "run_slow_tests": false}','lukas.bauer','2026-11-18T02:40:45Z','2026-11-18T02:41:40Z','2026-11-18T02:45:17Z',NULL);
INSERT INTO "runs" VALUES(13,1,1,2,1,'failed','push','main','a6a3a4506513270e269e0d37f2a74de452e6b438','{"log_level": "info", "run_slow_tests": false}','sara.okafor','2026-11-20T02:34:13Z','2026-11-20T02:34:47Z','2026-11-20T02:35:22Z',NULL);
INSERT INTO "runs" VALUES(14,5,13,2,2,'succeeded','push','main','133ad73dee1fdde031b4932c954c2fc1d3f2e52d','{"log_level": "info", "run_slow_tests": false}','jonas.weber','2026-11-21T18:15:36Z','2026-11-21T18:16:00Z','2026-11-21T18:20:15Z',NULL);
INSERT INTO "runs" VALUES(15,2,4,2,1,'succeeded','pull_request','feature/status-watch','519088f590fbbd119c1caaf75e8766ed88daf401','{"log_level": "info", "run_slow_tests": false}','jonas.weber','2026-11-23T05:28:40Z','2026-11-23T05:29:43Z','2026-11-23T05:41:41Z',NULL);
INSERT INTO "runs" VALUES(16,3,7,1,5,'succeeded','push','feature/cart-badge','effddeeaa842bc19796f74adfaf55496988af3fb','{"log_level": "info", "run_slow_tests": false}','tom.nguyen','2026-11-23T23:14:42Z','2026-11-23T23:15:10Z','2026-11-23T23:22:22Z',NULL);
INSERT INTO "runs" VALUES(17,2,4,2,2,'succeeded','pull_request','fix/timeouts','74e69a5d0dd27a65bd628881ad1b72dba7abe1c2','{"log_level": "info", "run_slow_tests": false}','sara.okafor','2026-11-26T05:01:58Z','2026-11-26T05:02:20Z','2026-11-26T05:11:34Z',NULL);
INSERT INTO "runs" VALUES(18,2,6,2,1,'succeeded','schedule','main','c92bdd5aa3ec4d322907db86e4219307d31615e5','{"suite": "full"}','knecht-scheduler','2026-11-27T21:20:31Z','2026-11-27T21:21:52Z','2026-11-27T21:29:48Z',NULL);
INSERT INTO "runs" VALUES(19,4,10,2,5,'succeeded','pull_request','feature/no-std','c730a7cba085da1fd958b1e68cd0326074aaf340','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-11-29T07:49:08Z','2026-11-29T07:50:03Z','2026-11-29T08:01:26Z',NULL);
INSERT INTO "runs" VALUES(20,4,10,2,6,'succeeded','push','feature/simd-decode','e9526a69d97e967b6c18d982d1dcec53212a8d9b','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-11-30T15:29:18Z','2026-11-30T15:29:31Z','2026-11-30T15:35:03Z',NULL);
INSERT INTO "runs" VALUES(21,4,11,2,1,'succeeded','manual','main','ea81ad63cf9d5d05f4e64fe649b29bbe7deb30ad','{"dry_run": false, "environment": "staging", "version": "v3.0.1"}','jonas.weber','2026-12-02T11:51:37Z','2026-12-02T11:51:47Z','2026-12-02T12:01:39Z',NULL);
INSERT INTO "runs" VALUES(22,3,7,1,6,'succeeded','push','main','20859634fe3c9c8f2b855c1f28aaca51b98c67c2','{"log_level": "info", "run_slow_tests": false}','mei.chen','2026-12-03T02:31:29Z','2026-12-03T02:32:52Z','2026-12-03T02:44:33Z',NULL);
INSERT INTO "runs" VALUES(23,1,1,2,2,'failed','rerun','main','a6a3a4506513270e269e0d37f2a74de452e6b438','{"log_level": "info", "run_slow_tests": false}','sara.okafor','2026-12-04T15:55:19Z','2026-12-04T15:56:35Z','2026-12-04T15:57:22Z',13);
INSERT INTO "runs" VALUES(24,5,13,2,3,'succeeded','push','feature/rds-upgrade','27be9ab1c0236e49da6e6d8e8778f742f527b5c2','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-12-06T06:27:23Z','2026-12-06T06:27:38Z','2026-12-06T06:34:57Z',NULL);
INSERT INTO "runs" VALUES(25,1,1,2,3,'succeeded','pull_request','feature/refund-currency','a5464f6d983fd97359af6769e486737d8ff4ef93','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-12-07T02:17:31Z','2026-12-07T02:18:50Z','2026-12-07T02:22:49Z',NULL);
INSERT INTO "runs" VALUES(26,3,7,2,7,'succeeded','pull_request','fix/ci-cache','057a40b22188287e8c5c715f8c74fc1e27e9e06f','{"log_level": "info", "run_slow_tests": false}','sara.okafor','2026-12-09T02:52:27Z','2026-12-09T02:53:07Z','2026-12-09T03:01:42Z',NULL);
INSERT INTO "runs" VALUES(27,2,4,2,3,'succeeded','pull_request','feature/log-follow','83f73f16dbf4a8b2b0c4312d20203626f3fe39c0','{"log_level": "info", "run_slow_tests": false}','tom.nguyen','2026-12-10T01:23:50Z','2026-12-10T01:25:18Z','2026-12-10T01:31:45Z',NULL);
INSERT INTO "runs" VALUES(28,2,4,2,4,'succeeded','pull_request','fix/timeouts','78de33617830b083894e9f37faa09f65d76de60b','{"log_level": "info", "run_slow_tests": false}','tom.nguyen','2026-12-12T19:41:09Z','2026-12-12T19:41:11Z','2026-12-12T19:47:03Z',NULL);
INSERT INTO "runs" VALUES(29,1,1,2,4,'succeeded','push','main','a6a3a4506513270e269e0d37f2a74de452e6b438','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-12-14T01:13:35Z','2026-12-14T01:14:23Z','2026-12-14T01:28:35Z',NULL);
INSERT INTO "runs" VALUES(30,4,10,2,7,'succeeded','push','main','c285a8c6b73c30c80c6478014858079eee1addc8','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-12-14T15:31:22Z','2026-12-14T15:32:05Z','2026-12-14T15:39:26Z',NULL);
INSERT INTO "runs" VALUES(31,3,7,2,8,'cancelled','pull_request','feature/checkout-v2','d34979b3cbf93e3fb1f925cb7dd1e6c7187f132d','{"log_level": "info", "run_slow_tests": false}','anna.schmidt','2026-12-16T15:41:53Z','2026-12-16T15:42:58Z','2026-12-16T15:55:06Z',NULL);
INSERT INTO "runs" VALUES(32,2,4,2,5,'succeeded','pull_request','feature/status-watch','4360c66a4d9aa69634c411c35f381d790671ce23','{"log_level": "info", "run_slow_tests": false}','lukas.bauer','2026-12-18T00:48:07Z','2026-12-18T00:49:18Z','2026-12-18T01:00:06Z',NULL);
INSERT INTO "runs" VALUES(33,4,10,2,8,'succeeded','push','fix/flaky-test','d3971494b402b288c1364fe54d2f9bba4479c074','{"log_level": "info", "run_slow_tests": false}','jonas.weber','2026-12-19T15:47:48Z','2026-12-19T15:48:09Z','2026-12-19T15:55:10Z',NULL);
INSERT INTO "runs" VALUES(34,4,10,2,9,'failed','push','main','76c338fa636a5479e29f9ecb34d982fb47e2cc36','{"log_level": "info", "run_slow_tests": false}','tom.nguyen','2026-12-21T23:25:04Z','2026-12-21T23:25:57Z','2026-12-21T23:49:17Z',NULL);
INSERT INTO "runs" VALUES(35,1,1,2,5,'succeeded','pull_request','fix/flaky-test','4003ff33280da853a12e6df3b66f47acb6910780','{"log_level": "info", "run_slow_tests": false}','jonas.weber','2026-12-22T06:32:03Z','2026-12-22T06:33:06Z','2026-12-22T06:39:35Z',NULL);
INSERT INTO "runs" VALUES(36,4,10,2,10,'succeeded','rerun','main','76c338fa636a5479e29f9ecb34d982fb47e2cc36','{"log_level": "info", "run_slow_tests": false}','lukas.bauer','2026-12-24T00:32:07Z','2026-12-24T00:32:56Z','2026-12-24T00:38:13Z',34);
INSERT INTO "runs" VALUES(37,2,4,2,6,'succeeded','push','main','f8b44bc286ee7b4ff41e74e6f09f57916685b4b8','{"log_level": "info", "run_slow_tests": false}','jonas.weber','2026-12-25T15:04:08Z','2026-12-25T15:05:00Z','2026-12-25T15:16:37Z',NULL);
INSERT INTO "runs" VALUES(38,4,10,2,11,'cancelled','pull_request','feature/simd-decode','adc70e946d152eaafb9ebfb840e898f2affcd247','{"log_level": "info", "run_slow_tests": false}','mei.chen','2026-12-27T11:23:09Z','2026-12-27T11:23:11Z','2026-12-27T11:25:15Z',NULL);
INSERT INTO "runs" VALUES(39,4,12,3,1,'succeeded','schedule','main','a216ed03585bc3add4d1e96987d8891723f15ddf','{"suite": "full"}','knecht-scheduler','2026-12-28T02:03:15Z','2026-12-28T02:04:41Z','2026-12-28T02:14:27Z',NULL);
INSERT INTO "runs" VALUES(40,5,13,2,4,'running','pull_request','fix/timeouts','b15adcf27e9508cb3286dfae4c0b0f70d6bbcb67','{"log_level": "info", "run_slow_tests": false}','sara.okafor','2026-12-29T18:02:41Z','2026-12-29T18:03:10Z',NULL,NULL);
INSERT INTO "runs" VALUES(41,3,7,3,9,'queued','rerun','feature/checkout-v2','73f6e53d3853933d8ce621ef7f405bc8cfd3dd72','{"log_level": "info", "run_slow_tests": false}','alice','2026-12-01T09:46:05Z',NULL,NULL,3);
CREATE TABLE schema_migrations ( version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL);
INSERT INTO "schema_migrations" VALUES(1,'knecht','2026-12-01T09:46:05+00:00');
INSERT INTO "schema_migrations" VALUES(2,'audit','2026-12-01T09:46:05+00:00');
INSERT INTO "schema_migrations" VALUES(3,'proposals','2026-12-01T09:46:05+00:00');
INSERT INTO "schema_migrations" VALUES(4,'run_filters','2026-12-01T09:46:05+00:00');
INSERT INTO "schema_migrations" VALUES(5,'proposal_display','2026-12-01T09:46:05+00:00');
INSERT INTO "schema_migrations" VALUES(6,'run_filter_pairs','2026-12-01T09:46:05+00:00');
ANALYZE "sqlite_master";
INSERT INTO "sqlite_stat1" VALUES('project_variables','sqlite_autoindex_project_variables_1','35 7 1');
INSERT INTO "sqlite_stat1" VALUES('schema_migrations',NULL,'6');
INSERT INTO "sqlite_stat1" VALUES('branches','sqlite_autoindex_branches_1','22 5 1');
INSERT INTO "sqlite_stat1" VALUES('projects','sqlite_autoindex_projects_1','5 1');
INSERT INTO "sqlite_stat1" VALUES('workflows','sqlite_autoindex_workflows_1','15 3 1');
INSERT INTO "sqlite_stat1" VALUES('workflow_versions','sqlite_autoindex_workflow_versions_1','37 3 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_status_trigger','40 10 4 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_branch_status','40 4 3 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_branch_trigger','40 4 3 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_trigger','40 8 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_branch_only','40 4 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_rerun_of','40 14');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_branch','40 8 3 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_project_status','40 8 4 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_status','40 10 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_workflow','40 4 1');
INSERT INTO "sqlite_stat1" VALUES('runs','runs_by_project','40 8 1');
INSERT INTO "sqlite_stat1" VALUES('actions','sqlite_autoindex_actions_1','242 7 1');
INSERT INTO "sqlite_stat1" VALUES('log_lines','log_lines','1359 34 6 1');
INSERT INTO "sqlite_stat1" VALUES('proposals','proposals_by_subject','3 3 1');
INSERT INTO "sqlite_stat1" VALUES('proposals','proposals_by_status','3 1 1');
CREATE TABLE workflow_versions (
    workflow_id INTEGER NOT NULL REFERENCES workflows(id),
    version     INTEGER NOT NULL,
    definition  TEXT NOT NULL,
    inputs_json TEXT NOT NULL DEFAULT '{}',
    created_at  TEXT NOT NULL,
    created_by  TEXT NOT NULL,
    PRIMARY KEY (workflow_id, version)
);
INSERT INTO "workflow_versions" VALUES(1,1,'# .knecht/workflows/ci.yml (version 1)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: pip install -r requirements.txt -r requirements-dev.txt
  - name: lint
    run: ruff check . && mypy app
  - name: build
    run: docker build -t registry.internal/payments-api:$SHORT_SHA .
  - name: test
    run: pytest -q --maxfail=1
    timeout-minutes: 30
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2025-11-05T00:00:00Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(1,2,'# .knecht/workflows/ci.yml (version 2)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: pip install -r requirements.txt -r requirements-dev.txt
  - name: lint
    run: ruff check . && mypy app
  - name: build
    run: docker build -t registry.internal/payments-api:$SHORT_SHA .
  - name: test
    run: pytest -q --maxfail=1
    timeout-minutes: 20
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-11-15T15:40:16Z','jonas.weber');
INSERT INTO "workflow_versions" VALUES(2,1,'# .knecht/workflows/release.yml (version 1)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: pip install -r requirements.txt -r requirements-dev.txt
  - name: build
    run: docker build -t registry.internal/payments-api:$SHORT_SHA .
  - name: test
    run: pytest -q --maxfail=1
    timeout-minutes: 30
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: helm upgrade --install payments-api chart/ --set image.tag=$SHORT_SHA
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2025-11-05T00:00:00Z','tom.nguyen');
INSERT INTO "workflow_versions" VALUES(2,2,'# .knecht/workflows/release.yml (version 2)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: pip install -r requirements.txt -r requirements-dev.txt
  - name: build
    run: docker build -t registry.internal/payments-api:$SHORT_SHA .
  - name: test
    run: pytest -q --maxfail=1
    timeout-minutes: 20
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: helm upgrade --install payments-api chart/ --set image.tag=$SHORT_SHA
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-11-23T12:29:55Z','jonas.weber');
INSERT INTO "workflow_versions" VALUES(3,1,'# .knecht/workflows/nightly.yml (version 1)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: pip install -r requirements.txt -r requirements-dev.txt
  - name: build
    run: docker build -t registry.internal/payments-api:$SHORT_SHA .
  - name: test
    run: pytest -q --maxfail=1
    timeout-minutes: 30
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2025-11-05T00:00:00Z','sara.okafor');
INSERT INTO "workflow_versions" VALUES(3,2,'# .knecht/workflows/nightly.yml (version 2)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: pip install -r requirements.txt -r requirements-dev.txt
  - name: build
    run: docker build -t registry.internal/payments-api:$SHORT_SHA .
  - name: test
    run: pytest -q --maxfail=1
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-12-18T02:02:42Z','jonas.weber');
INSERT INTO "workflow_versions" VALUES(4,1,'# .knecht/workflows/ci.yml (version 1)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
  - name: lint
    run: go vet ./... && staticcheck ./...
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 30
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2025-12-12T00:00:00Z','lukas.bauer');
INSERT INTO "workflow_versions" VALUES(4,2,'# .knecht/workflows/ci.yml (version 2)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
  - name: lint
    run: go vet ./... && staticcheck ./...
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 20
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-11-12T15:23:44Z','tom.nguyen');
INSERT INTO "workflow_versions" VALUES(5,1,'# .knecht/workflows/release.yml (version 1)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 30
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: goreleaser release --clean
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2025-12-12T00:00:00Z','jonas.weber');
INSERT INTO "workflow_versions" VALUES(5,2,'# .knecht/workflows/release.yml (version 2)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 20
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: goreleaser release --clean
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-12-17T09:53:49Z','lukas.bauer');
INSERT INTO "workflow_versions" VALUES(6,1,'# .knecht/workflows/nightly.yml (version 1)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 30
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2025-12-12T00:00:00Z','lukas.bauer');
INSERT INTO "workflow_versions" VALUES(6,2,'# .knecht/workflows/nightly.yml (version 2)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-11-09T10:08:30Z','lukas.bauer');
INSERT INTO "workflow_versions" VALUES(6,3,'# .knecht/workflows/nightly.yml (version 3)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
    cache: [~/.cache, node_modules, target]
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-12-03T06:49:16Z','tom.nguyen');
INSERT INTO "workflow_versions" VALUES(6,4,'# .knecht/workflows/nightly.yml (version 4)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: go mod download
    cache: [~/.cache, node_modules, target]
  - name: build
    run: go build -trimpath -o dist/knecht-cli ./cmd/knecht-cli
  - name: test
    run: go test -race ./...
    timeout-minutes: 20
    retries: 1
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-12-09T10:22:13Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(7,1,'# .knecht/workflows/ci.yml (version 1)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: npm ci
  - name: lint
    run: npm run lint && npm run typecheck
  - name: build
    run: npm run build
  - name: test
    run: npm test -- --ci --reporters=default
    timeout-minutes: 30
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-01-18T00:00:00Z','sara.okafor');
INSERT INTO "workflow_versions" VALUES(7,2,'# .knecht/workflows/ci.yml (version 2)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: npm ci
  - name: lint
    run: npm run lint && npm run typecheck
  - name: build
    run: npm run build
  - name: test
    run: npm test -- --ci --reporters=default
    timeout-minutes: 20
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-12-03T04:26:45Z','mei.chen');
INSERT INTO "workflow_versions" VALUES(7,3,'# .knecht/workflows/ci.yml (version 3)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: npm ci
    cache: [~/.cache, node_modules, target]
  - name: lint
    run: npm run lint && npm run typecheck
  - name: build
    run: npm run build
  - name: test
    run: npm test -- --ci --reporters=default
    timeout-minutes: 20
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-12-21T05:42:29Z','sara.okafor');
INSERT INTO "workflow_versions" VALUES(8,1,'# .knecht/workflows/release.yml (version 1)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: npm ci
  - name: build
    run: npm run build
  - name: test
    run: npm test -- --ci --reporters=default
    timeout-minutes: 30
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: aws s3 sync dist/ s3://storefront-web-prod --delete && aws cloudfront create-invalidation
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-01-18T00:00:00Z','jonas.weber');
INSERT INTO "workflow_versions" VALUES(8,2,'# .knecht/workflows/release.yml (version 2)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: npm ci
  - name: build
    run: npm run build
  - name: test
    run: npm test -- --ci --reporters=default
    timeout-minutes: 20
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: aws s3 sync dist/ s3://storefront-web-prod --delete && aws cloudfront create-invalidation
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-11-11T22:57:34Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(9,1,'# .knecht/workflows/nightly.yml (version 1)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: npm ci
  - name: build
    run: npm run build
  - name: test
    run: npm test -- --ci --reporters=default
    timeout-minutes: 30
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-01-18T00:00:00Z','mei.chen');
INSERT INTO "workflow_versions" VALUES(9,2,'# .knecht/workflows/nightly.yml (version 2)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: npm ci
  - name: build
    run: npm run build
  - name: test
    run: npm test -- --ci --reporters=default
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-11-26T18:48:34Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(10,1,'# .knecht/workflows/ci.yml (version 1)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: cargo fetch --locked
  - name: lint
    run: cargo clippy --all-targets -- -D warnings
  - name: build
    run: cargo build --release
  - name: test
    run: cargo test --release
    timeout-minutes: 30
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-02-24T00:00:00Z','sara.okafor');
INSERT INTO "workflow_versions" VALUES(10,2,'# .knecht/workflows/ci.yml (version 2)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: cargo fetch --locked
  - name: lint
    run: cargo clippy --all-targets -- -D warnings
  - name: build
    run: cargo build --release
  - name: test
    run: cargo test --release
    timeout-minutes: 20
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-11-25T02:17:59Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(11,1,'# .knecht/workflows/release.yml (version 1)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: cargo fetch --locked
  - name: build
    run: cargo build --release
  - name: test
    run: cargo test --release
    timeout-minutes: 30
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: cargo publish --token $CARGO_REGISTRY_TOKEN
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-02-24T00:00:00Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(11,2,'# .knecht/workflows/release.yml (version 2)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: cargo fetch --locked
  - name: build
    run: cargo build --release
  - name: test
    run: cargo test --release
    timeout-minutes: 20
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: cargo publish --token $CARGO_REGISTRY_TOKEN
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-11-26T15:33:27Z','jonas.weber');
INSERT INTO "workflow_versions" VALUES(12,1,'# .knecht/workflows/nightly.yml (version 1)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: cargo fetch --locked
  - name: build
    run: cargo build --release
  - name: test
    run: cargo test --release
    timeout-minutes: 30
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-02-24T00:00:00Z','lukas.bauer');
INSERT INTO "workflow_versions" VALUES(12,2,'# .knecht/workflows/nightly.yml (version 2)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: cargo fetch --locked
  - name: build
    run: cargo build --release
  - name: test
    run: cargo test --release
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-11-05T01:05:27Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(12,3,'# .knecht/workflows/nightly.yml (version 3)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: cargo fetch --locked
    cache: [~/.cache, node_modules, target]
  - name: build
    run: cargo build --release
  - name: test
    run: cargo test --release
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-12-27T23:20:41Z','mei.chen');
INSERT INTO "workflow_versions" VALUES(13,1,'# .knecht/workflows/ci.yml (version 1)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
  - name: lint
    run: terraform fmt -check -recursive && tflint
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 30
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-04-02T00:00:00Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(13,2,'# .knecht/workflows/ci.yml (version 2)
name: ci
on:
  push:
    branches: [''**'']
  pull_request: {}
inputs:
  run_slow_tests:
    type: boolean
    required: false
    default: false
  log_level:
    type: choice
    required: false
    default: "info"
    options: [debug, info, warning]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
  - name: lint
    run: terraform fmt -check -recursive && tflint
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 20
','{"log_level": {"default": "info", "options": ["debug", "info", "warning"], "required": false, "type": "choice"}, "run_slow_tests": {"default": false, "required": false, "type": "boolean"}}','2026-11-16T10:38:56Z','lukas.bauer');
INSERT INTO "workflow_versions" VALUES(14,1,'# .knecht/workflows/release.yml (version 1)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 30
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: terraform apply -auto-approve plan.tfplan
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-04-02T00:00:00Z','tom.nguyen');
INSERT INTO "workflow_versions" VALUES(14,2,'# .knecht/workflows/release.yml (version 2)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 20
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: terraform apply -auto-approve plan.tfplan
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-11-30T07:35:48Z','jonas.weber');
INSERT INTO "workflow_versions" VALUES(14,3,'# .knecht/workflows/release.yml (version 3)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
    cache: [~/.cache, node_modules, target]
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 20
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: terraform apply -auto-approve plan.tfplan
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-12-10T08:41:43Z','lukas.bauer');
INSERT INTO "workflow_versions" VALUES(14,4,'# .knecht/workflows/release.yml (version 4)
name: release
on:
  push:
    tags: [''v*'']
  manual: {}
inputs:
  version:
    type: string
    required: true
  environment:
    type: choice
    required: true
    default: "staging"
    options: [staging, production]
  dry_run:
    type: boolean
    required: false
    default: false
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
    cache: [~/.cache, node_modules, target]
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 20
    retries: 1
  - name: publish
    run: knecht artifacts upload dist/
  - name: deploy
    run: terraform apply -auto-approve plan.tfplan
','{"dry_run": {"default": false, "required": false, "type": "boolean"}, "environment": {"default": "staging", "options": ["staging", "production"], "required": true, "type": "choice"}, "version": {"default": null, "required": true, "type": "string"}}','2026-12-14T18:20:51Z','mei.chen');
INSERT INTO "workflow_versions" VALUES(15,1,'# .knecht/workflows/nightly.yml (version 1)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 30
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 30
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-04-02T00:00:00Z','mei.chen');
INSERT INTO "workflow_versions" VALUES(15,2,'# .knecht/workflows/nightly.yml (version 2)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-11-12T17:44:21Z','anna.schmidt');
INSERT INTO "workflow_versions" VALUES(15,3,'# .knecht/workflows/nightly.yml (version 3)
name: nightly
on:
  schedule:
    - cron: ''0 2 * * *''
inputs:
  suite:
    type: choice
    required: false
    default: "full"
    options: [smoke, full]
timeout-minutes: 20
actions:
  - name: checkout
    run: git clone --depth 1 $REPO_URL . && git checkout $COMMIT_SHA
  - name: install
    run: terraform init -input=false
    cache: [~/.cache, node_modules, target]
  - name: build
    run: terraform plan -out=plan.tfplan
  - name: test
    run: go test ./test/... -timeout 30m
    timeout-minutes: 20
  - name: report
    run: knecht report --format junit results/*.xml
','{"suite": {"default": "full", "options": ["smoke", "full"], "required": false, "type": "choice"}}','2026-12-01T16:30:54Z','mei.chen');
CREATE TABLE workflows (
    id              INTEGER PRIMARY KEY,
    project_id      INTEGER NOT NULL REFERENCES projects(id),
    name            TEXT NOT NULL,
    path            TEXT NOT NULL,
    current_version INTEGER NOT NULL DEFAULT 1,
    created_at      TEXT NOT NULL,
    UNIQUE (project_id, name)
);
INSERT INTO "workflows" VALUES(1,1,'ci','.knecht/workflows/ci.yml',2,'2025-11-05T00:00:00Z');
INSERT INTO "workflows" VALUES(2,1,'release','.knecht/workflows/release.yml',2,'2025-11-05T00:00:00Z');
INSERT INTO "workflows" VALUES(3,1,'nightly','.knecht/workflows/nightly.yml',2,'2025-11-05T00:00:00Z');
INSERT INTO "workflows" VALUES(4,2,'ci','.knecht/workflows/ci.yml',2,'2025-12-12T00:00:00Z');
INSERT INTO "workflows" VALUES(5,2,'release','.knecht/workflows/release.yml',2,'2025-12-12T00:00:00Z');
INSERT INTO "workflows" VALUES(6,2,'nightly','.knecht/workflows/nightly.yml',4,'2025-12-12T00:00:00Z');
INSERT INTO "workflows" VALUES(7,3,'ci','.knecht/workflows/ci.yml',3,'2026-01-18T00:00:00Z');
INSERT INTO "workflows" VALUES(8,3,'release','.knecht/workflows/release.yml',2,'2026-01-18T00:00:00Z');
INSERT INTO "workflows" VALUES(9,3,'nightly','.knecht/workflows/nightly.yml',2,'2026-01-18T00:00:00Z');
INSERT INTO "workflows" VALUES(10,4,'ci','.knecht/workflows/ci.yml',2,'2026-02-24T00:00:00Z');
INSERT INTO "workflows" VALUES(11,4,'release','.knecht/workflows/release.yml',2,'2026-02-24T00:00:00Z');
INSERT INTO "workflows" VALUES(12,4,'nightly','.knecht/workflows/nightly.yml',3,'2026-02-24T00:00:00Z');
INSERT INTO "workflows" VALUES(13,5,'ci','.knecht/workflows/ci.yml',2,'2026-04-02T00:00:00Z');
INSERT INTO "workflows" VALUES(14,5,'release','.knecht/workflows/release.yml',4,'2026-04-02T00:00:00Z');
INSERT INTO "workflows" VALUES(15,5,'nightly','.knecht/workflows/nightly.yml',3,'2026-04-02T00:00:00Z');
CREATE INDEX runs_by_project ON runs (project_id, id DESC);
CREATE INDEX runs_by_workflow ON runs (workflow_id, id DESC);
CREATE INDEX runs_by_status ON runs (status, id DESC);
CREATE INDEX runs_by_project_status ON runs (project_id, status, id DESC);
CREATE INDEX runs_by_branch ON runs (project_id, branch, id DESC);
CREATE INDEX runs_by_rerun_of ON runs (rerun_of);
CREATE INDEX audit_by_subject ON audit_log (subject, id);
CREATE INDEX audit_by_tool ON audit_log (tool, id);
CREATE INDEX proposals_by_status ON proposals (status, id);
CREATE INDEX proposals_by_subject ON proposals (proposer_subject, id);
CREATE INDEX runs_by_branch_only ON runs (branch, id DESC);
CREATE INDEX runs_by_trigger ON runs (trigger, id DESC);
CREATE INDEX runs_by_branch_trigger ON runs (branch, trigger, id DESC);
CREATE INDEX runs_by_branch_status ON runs (branch, status, id DESC);
CREATE INDEX runs_by_status_trigger ON runs (status, trigger, id DESC);
COMMIT;
