"""DeliveryReport.split_order_violators: records out of order after an unconfirmed report
(resent: the broker's doing) apart from the others (a broken order)."""

from __future__ import annotations

from logsdk.testing import DeliveryReport


def test_out_of_order_records_are_split_by_their_own_unconfirmed_report() -> None:
    rep = DeliveryReport(order_violators=[("a", 3), ("a", 7), ("b", 3), ("c", 1)])
    late, other = rep.split_order_violators({"a": {3, 4}, "b": set()})
    assert late == [("a", 3)]  # a's 3 was unconfirmed; 3 of producer b was not
    assert other == [("a", 7), ("b", 3), ("c", 1)]  # c traced nothing: never explained
    assert rep.split_order_violators({}) == ([], rep.order_violators)
